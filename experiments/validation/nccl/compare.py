#!/usr/bin/env python3
"""Predict every point of data/nccl_measurements.json, data/nccl_alltoall.json and
data/nccl_curves.json with `trainsim nccl-test` and print predicted against measured bus
bandwidth (and time), with the error, the algorithm and protocol NCCL's model picks, and the
mean and worst error per table (and without the points marked as known misses).

Usage, from the repository root after cargo build --release:
    experiments/validation/nccl/compare.py
"""
import json, os, subprocess, sys

here = os.path.dirname(os.path.abspath(__file__))
data = json.load(open(os.path.join(here, '..', 'data', 'nccl_measurements.json')))
a2a = json.load(open(os.path.join(here, '..', 'data', 'nccl_alltoall.json')))
curves = json.load(open(os.path.join(here, '..', 'data', 'nccl_curves.json')))


def run(p):
    args = ['target/release/trainsim', 'nccl-test', '--json', '--op', p['op'], '--node', p['node'],
            '--nodes', str(p.get('nodes', 1)), '--gpus', str(p['gpus']),
            '--min-bytes', p['size'], '--max-bytes', p['size']]
    if 'nics' in p:
        args += ['--nics', str(p['nics'])]
    if 'nic' in p:
        args += ['--nic', p['nic']]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{p['id']}: {out.stderr.strip()}")
    return json.loads(out.stdout)['results'][0]


def table(title, rows, key, unit, pred_key):
    print(f"\n## {title}\n")
    print(f"| point | size | measured {unit} | predicted {unit} | error | algorithm/protocol |")
    print("|---|---|---|---|---|---|")
    errs, kept = [], []
    for p in rows:
        r = run(p)
        got, want = r[pred_key], p[key]
        e = got / want - 1
        errs.append(abs(e))
        if 'known_miss' not in p:
            kept.append(abs(e))
        flag = ' (known miss)' if 'known_miss' in p else ''
        print(f"| {p['id']}{flag} | {p['size']} | {want} | {got:.1f} | {e*100:+.0f}% | {r['algorithm']}/{r['protocol']} |")
    within = sum(e <= 0.15 for e in errs)
    print(f"\nmean |error| {sum(errs)/len(errs)*100:.0f}%, worst {max(errs)*100:.0f}%, "
          f"{within} of {len(errs)} points within 15%")
    if kept and len(kept) < len(errs):
        print(f"without the known misses: mean |error| {sum(kept)/len(kept)*100:.0f}%, "
              f"worst {max(kept)*100:.0f}% over {len(kept)} points")


table('Bus bandwidth at large sizes', data['bus_bandwidth'], 'busbw_GBps', 'busbw GB/s', 'busbw_GBps')
table('Small-message time (8 B all-reduce, ' + data['latency_source'][:60] + '...)',
      data['latency'], 'time_us', 'us', 'time_us')
table('All-to-all bus bandwidth (nccl-tests alltoall_perf)', a2a['bus_bandwidth'], 'busbw_GBps',
      'busbw GB/s', 'busbw_GBps')
table('All-to-all time, 1-4 MB (nccl-tests alltoall_perf)', a2a['latency'], 'time_us', 'us', 'time_us')


def sweep(c):
    sizes = [p['bytes'] for p in c['points']]
    args = ['target/release/trainsim', 'nccl-test', '--json', '--op', c['op'], '--node', c['node'],
            '--nodes', str(c.get('nodes', 1)), '--gpus', str(c['gpus']),
            '--min-bytes', str(min(sizes)), '--max-bytes', str(max(sizes))]
    # The NCCL_ALGO / NCCL_PROTO the run set, if any.
    args += [a for k, flag in (('nccl_algo', '--algo'), ('nccl_proto', '--proto')) if k in c for a in (flag, c[k])]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{c['id']}: {out.stderr.strip()}")
    return {int(r['size_bytes']): r for r in json.loads(out.stdout)['results']}


print("\n## Size sweeps (data/nccl_curves.json): time at every size\n")
print("| curve | points | mean abs error | worst | within 15% | from 64 MB: mean, worst |")
print("|---|---|---|---|---|---|")
details = []
for c in curves['curves']:
    got = sweep(c)
    errs = [(p['bytes'], got[p['bytes']]['time_us'] / p['time_us'] - 1, p, got[p['bytes']]) for p in c['points']]
    big = [abs(e) for b, e, _, _ in errs if b >= 64 << 20]
    flag = ' (known miss)' if 'known_miss' in c else ''
    a = [abs(e) for _, e, _, _ in errs]
    print(f"| {c['id']}{flag} | {len(a)} | {sum(a)/len(a)*100:.0f}% | {max(a)*100:.0f}% | "
          f"{sum(x <= 0.15 for x in a)} of {len(a)} | {sum(big)/len(big)*100:.0f}%, {max(big)*100:.0f}% |")
    details.append((c, errs))
for c, errs in details:
    print(f"\n### {c['id']}\n")
    print("| size | measured us | predicted us | error | algorithm/protocol/channels |")
    print("|---|---|---|---|---|")
    for b, e, p, r in errs:
        print(f"| {b} | {p['time_us']} | {r['time_us']:.1f} | {e*100:+.0f}% | {r['algorithm']}/{r['protocol']}/{r['channels']} |")
