#!/usr/bin/env python3
"""shares.py [--costs merge|render] FOLDED.gz...: the share of all node samples whose stack passes through
each cost this section changed (one column per profile); `--costs merge`: the costs the 2026-12-03 last
section changed instead; `--costs render`: those of the twin written straight as text (2026-12-03, final)."""
import gzip, re, sys

COSTS = {
    "dedupe windows: remember (both windows)": r"dedupe::(Dedupe|RecentReplies)::remember",
    "SipHash (every caller)": r"sip::Hasher",
    "front door: twin body written out again": r"http::twins::write::.*serde_json::ser::to_string",
    "postcard encodes (log entries, inter-node messages)": r"storage::store::encode|transport::wire::encode|postcard::ser::to_allocvec|scratch::postcard_vec",
    "snapshot builds (all)": r"build_snapshot",
    "snapshot: copying the dedupe windows": r"dedupe::(Dedupe|RecentReplies) as core::clone",
    "snapshot: writing the dedupe windows": r"dedupe::_::<impl serde_core::ser::Serialize|dedupe::serialize_in_order",
}

MERGE = {
    "merging a patch into a section (Packed::merged)": r"Packed::merged",
    "sections unpacked into trees (NodeRef::to_node)": r"NodeRef::to_node",
    "numbers parsed to be rendered (Number from text, under a twin render)": r"render_text.*FromStr for serde_json::number::Number",
    "rendering the twin a write answers (twin_text)": r"ShardState::twin_text",
    "parsing the patch text (validate::parse_json)": r"validate::parse_json",
    "state machine apply, all (openraft's state machine worker)": r"openraft::core::sm::worker",
}

RENDER = {
    "rendering the twin a write answers (twin_text)": r"ShardState::twin_text",
    "… of it, escaping strings": r"ShardState::twin_text.*(format_escaped_str|write_json_str)",
    "… of it, writing timestamps": r"ShardState::twin_text.*Timestamp",
    "… of it, serde's map and struct machinery": r"ShardState::twin_text.*(SerializeMap|SerializeStruct)",
    "state machine apply, all (openraft's state machine worker)": r"openraft::core::sm::worker",
}

args = sys.argv[1:]
if args[:1] == ["--costs"]:
    COSTS, args = {"merge": MERGE, "render": RENDER}[args[1]], args[2:]

cols = []
for path in args:
    total, hits = 0, dict.fromkeys(COSTS, 0)
    for line in gzip.open(path, "rt"):
        stack, n = line.rsplit(" ", 1)
        total += int(n)
        for name, pat in COSTS.items():
            if re.search(pat, stack):
                hits[name] += int(n)
    cols.append((path, total, hits))
print("| cost | " + " | ".join(f"{p.split('/')[-1]} ({t:,} samples)" for p, t, _ in cols) + " |")
print("| --- |" + " ---: |" * len(cols))
for name in COSTS:
    print(f"| {name} | " + " | ".join(f"{100 * h[name] / t:.2f} %" for _, t, h in cols) + " |")
