"""``data.partition``: which samples each client holds, one typed section per kind (each takes only its own
settings), a user's ``package.module:function`` beside them, and the flat keys of older configs mapped to the kind
they belong to."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from fedsim.config.base import SHORT, Section


class PartitionSettings(Section):
    """Which samples each client holds: ``data.partition: {name: dirichlet, beta: 0.3}`` (a bare name keeps the
    kind's defaults). Each kind takes only its own settings."""
    name: str

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of ``fedsim.data.make_partition`` for this kind."""
        return {}


class IidPartition(PartitionSettings):
    name: Literal["iid"] = "iid"


class ClassesPartition(PartitionSettings):
    name: Literal["classes"] = "classes"
    k: int = Field(4, ge=1, description="at most k classes per client (FedPer), each class split among its holders")

    def arguments(self) -> dict[str, Any]:
        return {"k": self.k}


class ShardsPartition(PartitionSettings):
    name: Literal["shards"] = "shards"
    shards_per_client: int = Field(ge=1, description="s: shards per client")
    style: Literal["fedbabu", "sorted_pool"] = Field(
        "fedbabu", description="fedbabu = single-class shards, test set of the train class mix and equal size "
        "(FedBABU's noniid); sorted_pool = fedsim's earlier label-sorted cut, to reproduce old runs")

    def arguments(self) -> dict[str, Any]:
        return {"shards_per_client": self.shards_per_client, "shard_style": self.style}


class DirichletPartition(PartitionSettings):
    name: Literal["dirichlet"] = "dirichlet"
    beta: float = Field(gt=0, description="concentration: 0.1 = strong label skew, 100 = near iid")

    def arguments(self) -> dict[str, Any]:
        return {"beta": self.beta}


class ConflictingPartition(PartitionSettings):
    name: Literal["conflicting"] = "conflicting"
    agreed: float = Field(0.0, ge=0, lt=1, description="fraction of the classes (the first round(agreed x C)) that "
                          "keep their true label at every client; the others are permuted per client (0 = every "
                          "class, so FedAvg is at chance by construction)")

    def arguments(self) -> dict[str, Any]:
        return {"agreed": self.agreed}


class NaturalPartition(PartitionSettings):
    name: Literal["natural"] = "natural"


class UserPartition(PartitionSettings):
    """A user's ``package.module:function``."""

    @field_validator("name")
    @classmethod
    def _a_plugin(cls, name: str) -> str:
        if ":" not in name:
            raise ValueError(f"unknown partition {name!r}; choose one of {', '.join(PARTITIONS)} or give "
                             "'package.module:function'")
        return name


PARTITIONS: dict[str, type[PartitionSettings]] = {cls.model_fields["name"].default: cls for cls in (
    IidPartition, ClassesPartition, ShardsPartition, DirichletPartition, ConflictingPartition, NaturalPartition)}
# Flat keys of fedsim before partitions were typed: flat key -> (the kind it belongs to, its name there, its old
# default). They keep working: moved into the partition they belong to, ignored by the others (as before).
FLAT_PARTITION_KEYS: dict[str, tuple[str, str, Any]] = {
    "k": ("classes", "k", 4), "shards_per_client": ("shards", "shards_per_client", None),
    "shard_style": ("shards", "style", "fedbabu"), "beta": ("dirichlet", "beta", None)}


def typed_partition(value: Any) -> PartitionSettings:
    if isinstance(value, PartitionSettings):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"data.partition: expected a name or {{name: ..., its settings}}, got {SHORT.repr(value)}")
    name: Any = value.get("name")  # not a kind's name: a user's 'package.module:function', checked as one
    return PARTITIONS.get(name, UserPartition).model_validate(value)
