from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Replicas(_message.Message):
    __slots__ = ("count", "all")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    count: int
    all: bool
    def __init__(self, count: _Optional[int] = ..., all: bool = ...) -> None: ...

class Knobs(_message.Message):
    __slots__ = ("default_replicas", "forbid_memory_oversubscription", "hysteresis", "rebalance_compute_seconds", "first_rebalance_compute_seconds", "routing_fill_factor", "routing_fill_mode", "routing_policy")
    DEFAULT_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    FORBID_MEMORY_OVERSUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    HYSTERESIS_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_REBALANCE_COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FILL_FACTOR_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FILL_MODE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_POLICY_FIELD_NUMBER: _ClassVar[int]
    default_replicas: Replicas
    forbid_memory_oversubscription: bool
    hysteresis: float
    rebalance_compute_seconds: float
    first_rebalance_compute_seconds: float
    routing_fill_factor: float
    routing_fill_mode: str
    routing_policy: str
    def __init__(self, default_replicas: _Optional[_Union[Replicas, _Mapping]] = ..., forbid_memory_oversubscription: bool = ..., hysteresis: _Optional[float] = ..., rebalance_compute_seconds: _Optional[float] = ..., first_rebalance_compute_seconds: _Optional[float] = ..., routing_fill_factor: _Optional[float] = ..., routing_fill_mode: _Optional[str] = ..., routing_policy: _Optional[str] = ...) -> None: ...

class GetSchedulingStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("worker", "routed_total", "outstanding_items")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    ROUTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_ITEMS_FIELD_NUMBER: _ClassVar[int]
    worker: str
    routed_total: int
    outstanding_items: int
    def __init__(self, worker: _Optional[str] = ..., routed_total: _Optional[int] = ..., outstanding_items: _Optional[int] = ...) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("name", "configured_replicas", "effective_replicas", "fill_mode", "fill_factor", "fill_quantum", "max_batch", "arrival_rate", "cost_per_item_seconds", "utilization", "weight_bytes", "replicas")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIGURED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    FILL_MODE_FIELD_NUMBER: _ClassVar[int]
    FILL_FACTOR_FIELD_NUMBER: _ClassVar[int]
    FILL_QUANTUM_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_RATE_FIELD_NUMBER: _ClassVar[int]
    COST_PER_ITEM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    name: str
    configured_replicas: Replicas
    effective_replicas: int
    fill_mode: str
    fill_factor: float
    fill_quantum: int
    max_batch: int
    arrival_rate: float
    cost_per_item_seconds: float
    utilization: float
    weight_bytes: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    def __init__(self, name: _Optional[str] = ..., configured_replicas: _Optional[_Union[Replicas, _Mapping]] = ..., effective_replicas: _Optional[int] = ..., fill_mode: _Optional[str] = ..., fill_factor: _Optional[float] = ..., fill_quantum: _Optional[int] = ..., max_batch: _Optional[int] = ..., arrival_rate: _Optional[float] = ..., cost_per_item_seconds: _Optional[float] = ..., utilization: _Optional[float] = ..., weight_bytes: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker", "models_placed", "outstanding_items", "compute_share", "weight_bytes", "weight_budget_bytes", "pressure")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    MODELS_PLACED_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_ITEMS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SHARE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    PRESSURE_FIELD_NUMBER: _ClassVar[int]
    worker: str
    models_placed: int
    outstanding_items: int
    compute_share: float
    weight_bytes: int
    weight_budget_bytes: int
    pressure: float
    def __init__(self, worker: _Optional[str] = ..., models_placed: _Optional[int] = ..., outstanding_items: _Optional[int] = ..., compute_share: _Optional[float] = ..., weight_bytes: _Optional[int] = ..., weight_budget_bytes: _Optional[int] = ..., pressure: _Optional[float] = ...) -> None: ...

class RepackStatus(_message.Message):
    __slots__ = ("repacks", "accumulated_compute_seconds", "budget_compute_seconds", "moved", "held_by_hysteresis")
    REPACKS_FIELD_NUMBER: _ClassVar[int]
    ACCUMULATED_COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    HELD_BY_HYSTERESIS_FIELD_NUMBER: _ClassVar[int]
    repacks: int
    accumulated_compute_seconds: float
    budget_compute_seconds: float
    moved: _containers.RepeatedScalarFieldContainer[str]
    held_by_hysteresis: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, repacks: _Optional[int] = ..., accumulated_compute_seconds: _Optional[float] = ..., budget_compute_seconds: _Optional[float] = ..., moved: _Optional[_Iterable[str]] = ..., held_by_hysteresis: _Optional[_Iterable[str]] = ...) -> None: ...

class SchedulingStatus(_message.Message):
    __slots__ = ("mode", "knobs", "models", "workers", "repack", "warnings")
    MODE_FIELD_NUMBER: _ClassVar[int]
    KNOBS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    REPACK_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    mode: str
    knobs: Knobs
    models: _containers.RepeatedCompositeFieldContainer[ModelStatus]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    repack: RepackStatus
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, mode: _Optional[str] = ..., knobs: _Optional[_Union[Knobs, _Mapping]] = ..., models: _Optional[_Iterable[_Union[ModelStatus, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., repack: _Optional[_Union[RepackStatus, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class SetModelReplicasRequest(_message.Message):
    __slots__ = ("model", "replicas")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    model: str
    replicas: Replicas
    def __init__(self, model: _Optional[str] = ..., replicas: _Optional[_Union[Replicas, _Mapping]] = ...) -> None: ...

class SetModelFillModeRequest(_message.Message):
    __slots__ = ("model", "fill_mode")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FILL_MODE_FIELD_NUMBER: _ClassVar[int]
    model: str
    fill_mode: str
    def __init__(self, model: _Optional[str] = ..., fill_mode: _Optional[str] = ...) -> None: ...

class SetKnobsRequest(_message.Message):
    __slots__ = ("knobs",)
    KNOBS_FIELD_NUMBER: _ClassVar[int]
    knobs: Knobs
    def __init__(self, knobs: _Optional[_Union[Knobs, _Mapping]] = ...) -> None: ...

class SetKnobsResponse(_message.Message):
    __slots__ = ("knobs",)
    KNOBS_FIELD_NUMBER: _ClassVar[int]
    knobs: Knobs
    def __init__(self, knobs: _Optional[_Union[Knobs, _Mapping]] = ...) -> None: ...

class RepackRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RepackResponse(_message.Message):
    __slots__ = ("repack", "warnings")
    REPACK_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    repack: RepackStatus
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, repack: _Optional[_Union[RepackStatus, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...
