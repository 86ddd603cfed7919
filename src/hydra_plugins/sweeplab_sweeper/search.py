"""hydra/sweeper=optuna's class and the registration of its configs (hydra/sweeper=optuna, hydra/sweeper/sampler=
<name>), where Hydra looks for them; the search is sweeplab.sweep.search, under sweeplab's import contracts."""

from hydra.core.config_store import ConfigStore

from sweeplab.sweep import search


class OptunaSearch(search.OptunaSearch):
    """sweeplab.sweep.search.OptunaSearch: Optuna's ask/tell, each trial run `replicates` times."""


ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=search.OptunaSearchConf, provider="sweeplab")
for _name, _node in search.SAMPLERS.items():
    ConfigStore.instance().store(group="hydra/sweeper/sampler", name=_name, node=_node, provider="sweeplab")
