"""PNG plots with matplotlib (Agg, no display needed), one set per (collective, type, op,
root): bus bandwidth vs size, latency vs size (log-log), and the ratio to the baseline.
Solid lines are out of place, dashed lines in place."""
from __future__ import annotations

from pathlib import Path

from ..timing import human_bytes
from .tables import ratio_curves

_STYLE = {"out-of-place": "-", "in-place": "--"}


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        from .data import ReportError
        raise ReportError("--plot needs matplotlib: pip install 'hpccoll[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _size_axis(ax, sizes) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(s for s in set(sizes) if s > 0)
    if len(ticks) > 12:
        ticks = ticks[::-(-len(ticks) // 12)]
    ax.set_xticks(ticks)
    ax.set_xticklabels([human_bytes(t).replace(" ", "") for t in ticks], rotation=45, ha="right")
    ax.set_xlabel("message size")
    ax.grid(True, which="both", alpha=0.3)


def _figure_name(coll, type_, op, root, many: bool) -> str:
    if not many:
        return coll
    parts = [coll, type_] + ([op] if op != "none" else []) + ([f"root{root}"] if root >= 0 else [])
    return "_".join(parts)


def draw(series: list, baseline_of, outdir, stat: str = "mean") -> list[Path]:
    """Write the plots into outdir (created if needed); returns the files written."""
    plt = _pyplot()
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    figs: dict = {}     # (coll, type, op, root) -> {placement: {series: [(size, t, busbw)]}}
    for s in series:
        for (g, size), (t, bw) in s.points(stat).items():
            coll, type_, op, root, placement = g
            figs.setdefault((coll, type_, op, root), {}).setdefault(placement, {}) \
                .setdefault(s.name, []).append((size, t, bw))
    ratios = ratio_curves(series, baseline_of, stat)
    per_coll: dict = {}
    for key in figs:
        per_coll[key[0]] = per_coll.get(key[0], 0) + 1
    # one colour per series, the line style tells the placement
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    color = {s.name: cycle[i % len(cycle)] for i, s in enumerate(series)}
    written = []
    for key, by_place in figs.items():
        coll, type_, op, root = key
        name = _figure_name(coll, type_, op, root, per_coll[coll] > 1)
        title = f"{coll} {type_}" + (f" {op}" if op != "none" else "") + \
            (f" root {root}" if root >= 0 else "")
        sizes = [p[0] for lines in by_place.values() for pts in lines.values() for p in pts]
        for what, ylabel, col, logy in (("busbw", "bus bandwidth (GB/s)", 2, False),
                                        ("latency", f"time ({stat}, us)", 1, True)):
            fig, ax = plt.subplots(figsize=(8, 5))
            for placement, lines in by_place.items():
                for sname, pts in lines.items():
                    pts = sorted(p for p in pts if p[0] > 0)
                    if pts:
                        ax.plot([p[0] for p in pts], [p[col] for p in pts], _STYLE[placement],
                                color=color[sname], marker="o", markersize=3,
                                label=f"{sname} ({placement})")
            _size_axis(ax, sizes)
            if logy:
                ax.set_yscale("log")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{title}: {'bus bandwidth' if what == 'busbw' else 'latency'} vs size")
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = outdir / f"{name}_{what}.png"
            fig.savefig(path, dpi=100)
            plt.close(fig)
            written.append(path)
        mine = {k: v for k, v in ratios.items() if k[0][:4] == key}
        if mine:
            fig, ax = plt.subplots(figsize=(8, 5))
            for (g, sname), (xs, ys) in mine.items():
                pts = [(x, y) for x, y in zip(xs, ys) if x > 0]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], _STYLE[g[4]], marker="o",
                        color=color[sname], markersize=3, label=f"{sname} ({g[4]})")
            ax.axhline(1.0, color="gray", linewidth=1)
            _size_axis(ax, sizes)
            ax.set_ylabel("baseline time / time (> 1: faster)")
            ax.set_title(f"{title}: ratio to baseline")
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = outdir / f"{name}_ratio.png"
            fig.savefig(path, dpi=100)
            plt.close(fig)
            written.append(path)
    return written
