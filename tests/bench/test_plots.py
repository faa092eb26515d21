"""Every saved figure names the machine it was measured on (bench.plots.save_figure)."""

from __future__ import annotations

from mindspore_relaygr.bench import plots

MACHINE = {"cpu_model": "AMD EPYC", "cores": 2, "matmul_gflops": [150.04, 165.2], "mindspore": "2.10.0",
           "python": "3.11.7", "date_utc": "2026-11-26 08:19"}


def test_caption_names_cpu_cores_fastest_matmul_version_and_date():
    assert plots.machine_caption(MACHINE) == (
        "AMD EPYC, 2 cores, fp32 matmul 165 GFLOP/s, MindSpore 2.10.0, 2026-11-26 08:19 UTC")
    unmeasured = {**MACHINE, "matmul_gflops": []}
    assert plots.machine_caption(unmeasured) == "AMD EPYC, 2 cores, MindSpore 2.10.0, 2026-11-26 08:19 UTC"


def test_saved_figure_carries_the_caption(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "_measured_machine", lambda: MACHINE)
    plt = plots.pyplot()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    plots.save_figure(fig, tmp_path / "f.png")
    captions = [t.get_text() for t in fig.texts]
    plt.close(fig)
    assert len(captions) == 1
    assert captions[0].startswith("AMD EPYC, 2 cores, fp32 matmul 165 GFLOP/s, MindSpore 2.10.0, ")
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
