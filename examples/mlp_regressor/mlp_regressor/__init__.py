"""The MLP regressor family: its record is all sweeplab needs (docs/families.md in sweeplab's checkout)."""

from sweeplab.families import Family

FAMILY = Family(
    "mlp_regressor",
    monitor="val/loss",
    monitor_mode="min",
    model_config="mlp_regressor.model:MLPConfig",  # SIZES beside it, `tiny` among them
    model="mlp_regressor.model:MLPRegressor",
    datamodule="mlp_regressor.data:RegressionData",
    model_keys_for_data=("in_dim",),  # the data's width is the model's
    task="mlp_regressor.task:RegressionTask",
    name_keys=("model.hidden",),
    report_keys=("model.size",),
    config_searchpath="pkg://mlp_regressor.conf",
)
