"""The one build step pyproject.toml cannot declare: the checkout's top-level conf/ (where Hydra users look for a
project's configs) goes into the wheel as sweeplab/conf, so a non-editable install composes the same configs.
An editable install reads conf/ from the checkout (sweeplab.CONF_DIR)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithConf(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "sweeplab" / "conf"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(Path(__file__).resolve().parent / "conf", target, ignore=shutil.ignore_patterns("__pycache__"))


setup(cmdclass={"build_py": BuildPyWithConf})
