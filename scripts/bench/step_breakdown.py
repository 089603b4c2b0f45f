"""One rank's CPU time per part of a training step, from `perf script -F comm,ip,sym` of a
`perf record --call-graph dwarf` run (scripts/bench/multihot_profile.sh): each sample goes to
the first part whose pattern a frame of its stack (or its thread's name) contains.

    python3 scripts/bench/step_breakdown.py SCRIPT.txt STEPS HZ [TOP]

prints milliseconds of CPU per step and shares (evaluation left out of the shares); with
TOP, the TOP most frequent stacks that fell in no part."""
import collections, sys
path, steps, hz = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
stacks = []
cur = None
for line in open(path):
    line = line.rstrip()
    if not line:
        if cur: stacks.append(cur)
        cur = None
        continue
    if not line.startswith(('\t', ' ')):
        cur = (line.split()[0], [])
        continue
    parts = line.strip().split(None, 1)
    cur[1].append(parts[1] if len(parts) > 1 else parts[0])
if cur: stacks.append(cur)
cats = [
    ('evaluation (not timed)', ['evaluate']),
    ('leader: finite check of the merged list', ['first_non_finite', 'first_all_ones']),
    ('leader: table update', ['apply_updates', 'step_rows', 'resolve_slots', 'write_planned', 'ringrec-apply']),
    ('engine: waits (band, shm)', ['wait_sleeping', 'wait_all']),
    ('engine: other', ['ringrec-engine']),
    ('batch: dedupe (keys -> uniq, inverse)', ['Batch::index_keys']),
    ('batch: read rows + lists', ['append_rows', 'append_bags', 'TrainData']),
    ('lookup: table rows of the unique keys', ['EmbeddingTable::lookup']),
    ('load: CSR lists, gather, pooling', ['load_from']),
    ('MLP forward + backward', ['DenseModel<D>::step']),
    ('key gradients: segment sum + pooled spread', ['key_grads']),
    ('sparse exchange (encode, merge, barrier)', ['exchange_and_apply', 'exchange_and_update']),
    ('optimizer (Adam) + checks', ['DenseModel<D>::apply', 'non_finite_gradient']),
]
c = collections.Counter()
others = collections.Counter()
for comm, s in stacks:
    for name, pats in cats:
        if any(p in f for f in s for p in pats) or any(p == comm for p in pats):
            c[name] += 1
            break
    else:
        c['other'] += 1
        if len(sys.argv) > 4: others[comm + ' | ' + ' < '.join(f[:50] for f in s[:4])] += 1
total = sum(v for k, v in c.items() if not k.startswith('evaluation'))
for name, _ in cats + [('other', None)]:
    v = c.get(name, 0)
    label = 'other (start-up, waits outside the steps)' if name == 'other' else name
    print(f'{label:45s} {v / hz / steps * 1e3:7.2f} ms/step  {100 * v / max(total, 1):5.1f}%')
print(f'{"total (without evaluation)":45s} {total / hz / steps * 1e3:7.2f} ms/step')

for k, v in others.most_common(int(sys.argv[4]) if len(sys.argv) > 4 else 0): print(v, k)
