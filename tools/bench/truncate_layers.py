# Copies an HF model directory keeping only its first N decoder layers (a self-speculative
# "early exit" draft): config.json's num_hidden_layers = N, model.layers.{i>=N}.* dropped.
import json, os, shutil, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(dst, exist_ok=True)
for f in os.listdir(src):
    if f.endswith('.json') and f not in ('config.json', 'model.safetensors.index.json'):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
cfg = json.load(open(os.path.join(src, 'config.json')))
cfg['num_hidden_layers'] = n
json.dump(cfg, open(os.path.join(dst, 'config.json'), 'w'), indent=1)
def keep(name):
    if not name.startswith('model.layers.'): return True
    return int(name.split('.')[2]) < n
files = [f for f in os.listdir(src) if f.endswith('.safetensors')]
out_header, chunks, off = {}, [], 0
for f in sorted(files):
    with open(os.path.join(src, f), 'rb') as fh:
        hl = struct.unpack('<Q', fh.read(8))[0]
        h = json.loads(fh.read(hl))
        base = 8 + hl
        for name, meta in h.items():
            if name == '__metadata__' or not keep(name): continue
            a, b = meta['data_offsets']
            fh.seek(base + a)
            data = fh.read(b - a)
            out_header[name] = {'dtype': meta['dtype'], 'shape': meta['shape'], 'data_offsets': [off, off + len(data)]}
            chunks.append(data); off += len(data)
hb = json.dumps(out_header).encode()
hb += b' ' * ((8 - len(hb) % 8) % 8)
with open(os.path.join(dst, 'model.safetensors'), 'wb') as o:
    o.write(struct.pack('<Q', len(hb))); o.write(hb)
    for c in chunks: o.write(c)
print('kept', len(out_header), 'tensors,', off, 'bytes')
