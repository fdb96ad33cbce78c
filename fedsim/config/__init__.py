"""Typed run configuration: YAML file + ``key=value`` overrides -> validated :class:`RunConfig`.

One job per module: ``base`` (what every section shares), ``learning``, ``partition`` and ``execution`` (the sections),
``schema`` (:class:`RunConfig`), ``loading`` (files, overrides, validation), ``checks`` (the rules that tie
sections together) and ``fingerprint`` (which settings change results; what a resume must match). A sweep's
expansion into runs lives in ``fedsim.sweep.expand``, ``ConfigError`` in ``fedsim.errors``."""
from fedsim.config.checks import check_sections
from fedsim.config.execution import (AvailabilityConfig, DevicesConfig, EngineConfig, LoggingConfig, SystemConfig,
                                     WandbConfig)
from fedsim.config.fingerprint import changed_settings, result_settings, results_fingerprint, resume_fingerprint
from fedsim.config.learning import (CallbackSpec, DataConfig, EvalConfig, ModelConfig, OptimConfig, PartsConfig,
                                    ServerConfig, TrainConfig)
from fedsim.config.loading import load_tree, merge_trees, parse_overrides, refuse_defaults_only, set_dotted, validate
from fedsim.config.partition import PARTITIONS, PartitionSettings
from fedsim.config.privacy import AdaptiveClipping, PrivacyConfig
from fedsim.config.schema import AlgorithmConfig, Distribution, RunConfig, SearchConfig, TuneConfig

__all__ = ["PARTITIONS", "AdaptiveClipping", "PrivacyConfig", "AlgorithmConfig", "AvailabilityConfig", "CallbackSpec", "DataConfig", "DevicesConfig",
           "Distribution", "EngineConfig", "EvalConfig", "LoggingConfig", "ModelConfig", "OptimConfig",
           "PartitionSettings", "PartsConfig", "RunConfig", "SearchConfig", "ServerConfig", "SystemConfig", "TrainConfig",
           "TuneConfig", "WandbConfig", "changed_settings", "check_sections", "load_tree", "merge_trees",
           "parse_overrides", "refuse_defaults_only", "result_settings", "results_fingerprint", "resume_fingerprint",
           "set_dotted", "validate"]
