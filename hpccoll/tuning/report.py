"""``hpccoll-tune simulate``: every method on every model and network speed, as a
table on stdout, an HDF5 file and a PNG plot."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import baselines, layers
from .simulate import simulate
from .store import h5open, write_attrs

SPEEDS = (10, 25, 50, 100, 200, 400)


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


def save(res: dict, path: str, env: dict) -> None:
    from dataclasses import asdict
    with h5open(path, "w") as f:
        f.attrs["kind"] = "hpccoll.tuning.simulate"
        write_attrs(f, env)
        write_attrs(f, {f"network.{k}": v for k, v in asdict(res["net"]).items()})
        write_attrs(f, {f"device.{k}": v for k, v in asdict(res["dev"]).items()})
        f.attrs["source"] = "model: simulated under the analytic device/network model"
        f.create_dataset("models", data=np.array(res["models"], dtype="S"))
        f.create_dataset("speeds_gbps", data=np.array(res["speeds"], dtype=float))
        f.create_dataset("methods", data=np.array(res["methods"], dtype="S"))
        d = f.create_dataset("backward_time", data=res["backward"])
        d.attrs.update(units="s", dims="model x speed x method")
        f.create_dataset("buckets", data=res["buckets"]).attrs["dims"] = "model x speed x method"
        f.create_dataset("compute_time", data=res["compute"]).attrs["units"] = "s"
        g = f.create_group("plans")
        for (model, speed, name), p in res["plans"].items():
            d = g.create_dataset(f"{model}/{speed:g}/{name}",
                                 data=np.array([p.ends, p.blocks], dtype=np.int64))
            d.attrs["rows"] = "bucket end (exclusive), blocks"


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
