"""Hydra search-path plugin: the configs of model families registered from other packages join sweeplab's.

Hydra imports every module under the `hydra_plugins` namespace package when it composes a config; this one adds
`Family.config_searchpath` of each family in the `sweeplab.families` entry point group (sweeplab/families), so
`python -m sweeplab.train model=<theirs>` finds `model/<theirs>.yaml` in the family's own package.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class SweeplabFamilies(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from sweeplab.families import config_searchpaths

        for path in config_searchpaths():
            search_path.append(provider="sweeplab-family", path=path)
