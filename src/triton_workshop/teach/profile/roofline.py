"""The roofline: one call's achieved rates against the measured ceilings (the copy bandwidth,
cuBLAS's matmul), the verdict (memory- or compute-bound), and its picture.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

__all__ = ["Roofline", "roofline_png"]


@dataclass(frozen=True)
class Roofline:
    """One call's work and time, against the copy bandwidth and the matmul ceiling."""

    bytes: int
    flops: int
    seconds: float
    copy_gbps: float  # measured copy bandwidth, bytes read + written per second / 1e9
    peak_tflops: float  # measured cuBLAS matmul rate in the same dtype

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes

    @property
    def ridge(self) -> float:
        """The intensity where the two ceilings meet: below it, bytes limit the speed."""
        return self.peak_tflops * 1e12 / (self.copy_gbps * 1e9)

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12

    @property
    def bound(self) -> str:
        return "memory" if self.intensity < self.ridge else "compute"

    @property
    def roof_tflops(self) -> float:
        """The best rate possible at this intensity."""
        return min(self.peak_tflops, self.intensity * self.copy_gbps / 1e3)

    @property
    def fraction_of_roof(self) -> float:
        return self.tflops / self.roof_tflops

    def verdict(self) -> str:
        if self.bound == "memory":
            text = (f"memory-bound: {self.intensity:.3g} FLOP/byte, below the ridge at "
                    f"{self.ridge:.0f} FLOP/byte, so the bytes set the time. {self.gbps:.0f} GB/s "
                    f"is {100 * self.gbps / self.copy_gbps:.0f}% of the copy bandwidth "
                    f"({self.copy_gbps:.0f} GB/s)")
        else:
            text = (f"compute-bound: {self.intensity:.3g} FLOP/byte, above the ridge at "
                    f"{self.ridge:.0f} FLOP/byte, so the arithmetic sets the time. "
                    f"{self.tflops:.1f} TFLOP/s is {100 * self.tflops / self.peak_tflops:.0f}% of "
                    f"cuBLAS's {self.peak_tflops:.0f} TFLOP/s")
        if self.fraction_of_roof < 0.5:
            text += (". Far below the roof: look at the occupancy bound, spills and the waves "
                     "of the grid above, then at ncu")
        return text


def roofline_png(path: str | Path, points: Sequence[tuple[str, Roofline]], *,
                 title: str = "") -> Path:
    """Draw the roofline of ``points[0]``'s ceilings with every point on it; returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not points:
        raise ValueError("points must name at least one measured call")
    first = points[0][1]
    intensities = [p.intensity for _, p in points] + [first.ridge]
    lo, hi = min(intensities) / 10, max(intensities) * 10
    steps = 200
    xs = [lo * (hi / lo) ** (i / (steps - 1)) for i in range(steps)]
    roof = [min(first.peak_tflops, x * first.copy_gbps / 1e3) for x in xs]

    fig = Figure(figsize=(7.5, 4.8))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.loglog(xs, roof, color="black", linewidth=2,
              label=f"roof: copy {first.copy_gbps:.0f} GB/s, matmul {first.peak_tflops:.0f} TFLOP/s")
    ax.axvline(first.ridge, color="grey", linestyle=":", linewidth=1)
    ax.annotate(f"ridge {first.ridge:.0f} FLOP/B", (first.ridge, first.peak_tflops),
                textcoords="offset points", xytext=(5, -14), fontsize=8, color="grey")
    for (label, point), colour in zip(points, ("tab:green", "tab:blue", "tab:orange", "tab:red")):
        ax.loglog([point.intensity], [point.tflops], "o", color=colour, markersize=8,
                  label=f"{label}: {point.tflops:.3g} TFLOP/s, {point.gbps:.0f} GB/s")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title or "roofline")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path

