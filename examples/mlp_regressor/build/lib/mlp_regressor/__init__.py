"""The MLP regressor family: its record is all sweeplab needs (see sweeplab.families.Family)."""

from sweeplab.config import build, build_sized
from sweeplab.families import Family, name_value


def _model_config(values):
    from mlp_regressor.model import SIZES, MLPConfig

    return build_sized(MLPConfig, SIZES, values, "model")


def _datamodule(values, model_config):
    from mlp_regressor.data import RegressionData

    return build(RegressionData, {**values, "in_dim": model_config.in_dim}, "data")


def _task(model_config, loss_values, optim):
    from mlp_regressor.task import RegressionTask

    return RegressionTask(model_config, optim)


def _model_config_from_dict(values):
    from mlp_regressor.model import MLPConfig

    return MLPConfig(**values)


def _model(config):
    from mlp_regressor.model import MLPRegressor

    return MLPRegressor(config)


FAMILY = Family(
    "mlp_regressor",
    monitor="val/loss",
    monitor_mode="min",
    build_model_config=_model_config,
    build_datamodule=_datamodule,
    build_task=_task,
    name_parts=lambda cfg: {"model.hidden": f"hidden={name_value(cfg.model.hidden)}"} if cfg.model.hidden else {},
    model_config_from_dict=_model_config_from_dict,
    build_model=_model,
    report_params=("model.size",),
    report_metric=("val/r2", "val R²"),
    config_searchpath="pkg://mlp_regressor.conf",
)
