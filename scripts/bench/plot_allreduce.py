"""busbw vs message size for every backend of one `ringrec bench allreduce --json` run
(with the independent C reference's rows, backend mpi-c, when the run had --reference)."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src, out = sys.argv[1], sys.argv[2]
report = json.load(open(src))
fig, ax = plt.subplots(figsize=(8, 5))
for backend in dict.fromkeys(r["backend"] for r in report["rows"]):
    rows = [r for r in report["rows"] if r["backend"] == backend]
    ax.plot([r["size"] for r in rows], [r["busbw"] for r in rows], marker="o", ms=3,
            label=backend + (" (reference)" if backend in ("mpi", "mpi-c") else ""),
            linestyle="--" if backend in ("mpi", "mpi-c") else "-")
ax.set_xscale("log", base=2)
ax.set_xlabel("message size (bytes)")
ax.set_ylabel("busbw (GB/s)")
ax.set_title(f"ringrec bench allreduce: {report['ranks']} ranks, {report['hosts']} host(s), float sum")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(out, dpi=110)
print(f"wrote {out}")
