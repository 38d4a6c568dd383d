# Counts sched_wakeup events by waker thread and kernel mechanism (futex, eventfd, tcp, ...).
#   perf record -e sched:sched_wakeup -g -p NODE_PIDS -o wk.data -- sleep 4
#   perf script -i wk.data > wk.txt; python3 wakeups-by-cause.py wk.txt UPDATES_IN_WINDOW
import collections, sys
events, cur = [], None
for line in open(sys.argv[1]):
    if line.strip() and not line.startswith('\t'):
        if cur:
            events.append(cur)
        cur = {'comm': line.split()[0], 'stack': []}
    elif line.strip() and cur is not None:
        cur['stack'].append(line.split()[1])
if cur:
    events.append(cur)
count = collections.Counter()
for e in events:
    s = ' '.join(e['stack'])
    if 'futex_wake' in s: how = 'futex'
    elif 'eventfd_write' in s: how = 'eventfd'
    elif 'sock_def_readable' in s or 'tcp_' in s: how = 'tcp'
    elif 'kick_pool' in s or 'blk_update_request' in s or 'wake_page_function' in s or 'wake_bit_function' in s: how = 'block I/O'
    elif 'timer' in s: how = 'timer'
    else: how = 'other'
    count[(e['comm'][:15], how)] += 1
updates = float(sys.argv[2])
print(f"{len(events)} wakeups, {len(events) / updates:.1f} per update")
for (comm, how), n in count.most_common():
    print(f"{n:7d} {n / updates:6.2f}/update  waker={comm:15s} {how}")
