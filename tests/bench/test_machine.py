"""The machine record of every benchmark report."""

from __future__ import annotations

import json

import pytest

from mindspore_relaygr.bench.machine import cpu_model, machine_info
from mindspore_relaygr.bench.model_bench import write_report


def test_cpu_model_reads_the_first_model_name(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 9R14\n")
    assert cpu_model(info) == "AMD EPYC 9R14"
    assert cpu_model(tmp_path / "missing")  # falls back, never empty


@pytest.mark.slow
def test_every_report_carries_the_machine_it_ran_on(tmp_path):
    out = tmp_path / "r.json"
    write_report({"x": 1}, out)
    machine = json.loads(out.read_text())["machine"]
    assert machine["cores"] >= 1 and machine["cpu_model"] and machine["mindspore"].startswith("2.")
    assert len(machine["matmul_gflops"]) == 3 and all(g > 0 for g in machine["matmul_gflops"])
    assert machine_info(matmul_runs=0)["matmul_gflops"] == []
    write_report({"machine": {"given": True}}, out)  # a report that has its record keeps it
    assert json.loads(out.read_text())["machine"] == {"given": True}
