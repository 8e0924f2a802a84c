"""``hpccoll-tune simulate``: every method on every model and network speed, as a
table on stdout, an HDF5 file and a PNG plot."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import baselines, layers
from .simulate import simulate

SPEEDS = (10, 25, 50, 100, 200, 400)
KIND = "tuning.simulate"


def run(models=tuple(layers.ARCHITECTURES), speeds=SPEEDS, net=layers.Network(),
        dev=layers.Device()) -> dict:
    """backward[model, speed, method] in seconds, with each plan's shape."""
    methods = list(baselines.METHODS)
    out = np.zeros((len(models), len(speeds), len(methods)))
    buckets = np.zeros_like(out, dtype=np.int64)
    compute = np.zeros(len(models))
    plans = {}
    for i, m in enumerate(models):
        work = layers.workload(m, dev)
        compute[i] = work.compute.sum()
        for j, g in enumerate(speeds):
            prof = layers.model_profile(replace(net, link_gbps=float(g)), dev)
            for k, (name, p) in enumerate(baselines.plans(work, prof).items()):
                out[i, j, k] = simulate(work, p, prof).time
                buckets[i, j, k] = len(p.ends)
                plans[(m, g, name)] = p
    return {"models": list(models), "speeds": list(speeds), "methods": methods,
            "backward": out, "buckets": buckets, "compute": compute, "plans": plans,
            "net": net, "dev": dev}


def table(res: dict) -> str:
    m = res["methods"]
    head = (f"{'model':<11}{'Gb/s':>5}{'compute':>9}" + "".join(f"{x:>12}" for x in m)
            + f"{'vs (a)':>8}{'vs (b)':>8}{'vs (c)':>8}  planned blocks per bucket")
    lines = [f"backward time in ms (simulated; model: {res['dev'].name}, {res['net'].nodes} "
             f"nodes, {res['net'].block_gbps:g} Gb/s per block); vs = planned time cut", head]
    for i, model in enumerate(res["models"]):
        for j, g in enumerate(res["speeds"]):
            t = res["backward"][i, j]
            cuts = [1 - t[0] / t[k] for k in (1, 2, 3)]
            blocks = res["plans"][(model, g, "planned")].blocks
            shown = " ".join(map(str, blocks[:10])) + (" ..." if len(blocks) > 10 else "")
            lines.append(f"{model:<11}{g:>5g}{res['compute'][i] * 1e3:>9.1f}"
                         + "".join(f"{x * 1e3:>12.2f}" for x in t)
                         + "".join(f"{c:>8.1%}" for c in cuts) + f"  {shown}")
    return "\n".join(lines)


def save(res: dict, path: str, env: dict):
    """Append the simulation to the result file ``path`` as a run of kind tuning.simulate;
    returns the file it landed in."""
    from dataclasses import asdict
    from .. import h5log
    attrs = dict(env, source="model: simulated under the analytic device/network model",
                 **{f"network.{k}": v for k, v in asdict(res["net"]).items()},
                 **{f"device.{k}": v for k, v in asdict(res["dev"]).items()})
    run = h5log.RunWriter(path, "simulate", attrs, kind=KIND)
    with run:
        run.array("models", np.array(res["models"]))
        run.array("speeds_gbps", np.array(res["speeds"], dtype=float), {"units": "Gb/s"})
        run.array("methods", np.array(res["methods"]))
        run.array("backward_time", res["backward"], {"units": "s", "dims": "model x speed x method"})
        run.array("buckets", res["buckets"], {"dims": "model x speed x method"})
        run.array("compute_time", res["compute"], {"units": "s"})
        for (model, speed, name), p in res["plans"].items():
            run.array(f"plans/{model}/{speed:g}/{name}", np.array([p.ends, p.blocks], dtype=np.int64),
                      {"rows": "bucket end (exclusive), blocks"})
    return run.final_path


def from_run(run) -> dict:
    """``run()``'s result back from a tuning.simulate run, for ``table``."""
    from dataclasses import fields
    from .model import Plan
    a = run.arrays

    def settings(cls, prefix):
        values = {f.name: run.attrs[prefix + f.name] for f in fields(cls) if prefix + f.name in run.attrs}
        return replace(cls(), **{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    models, methods = [str(m) for m in a["models"]], [str(m) for m in a["methods"]]
    speeds = [float(g) for g in a["speeds_gbps"]]
    plans = {}
    for m in models:
        for g in speeds:
            for name in methods:
                ends, blocks = a[f"plans/{m}/{g:g}/{name}"]
                plans[(m, g, name)] = Plan(tuple(int(x) for x in ends), tuple(int(x) for x in blocks))
    return {"models": models, "speeds": speeds, "methods": methods, "backward": a["backward_time"],
            "buckets": a["buckets"], "compute": a["compute_time"], "plans": plans,
            "net": settings(layers.Network, "network."), "dev": settings(layers.Device, "device.")}


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(res["models"])
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
    styles = ["-o", "--s", ":^", "-.v"]
    base = res["methods"].index("ddp")
    for i, model in enumerate(res["models"]):
        ax = axes[i // cols][i % cols]
        ref = res["backward"][i, :, base]
        for k, name in enumerate(res["methods"]):
            ax.plot(res["speeds"], res["backward"][i, :, k] / ref, styles[k % len(styles)],
                    label=baselines.METHODS[name])
        ax.plot(res["speeds"], res["compute"][i] / ref, color="gray", ls=":",
                label="compute alone (no communication)")
        ax.set_xscale("log")
        ax.set_xticks(res["speeds"])
        ax.set_xticklabels([f"{s:g}" for s in res["speeds"]])
        ax.set_xlabel("network (Gb/s)")
        ax.set_ylabel("backward time / (a)")
        ax.set_title(f"{model} ((a): {ref.min() * 1e3:.0f} to {ref.max() * 1e3:.0f} ms)")
        ax.grid(alpha=0.3)
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].axis("off")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Simulated backward time per allocation method (model, not measured)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
