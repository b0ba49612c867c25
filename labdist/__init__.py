"""labdist: tf.distribute's ideas, made real on Dask workers. See SEMANTICS in the docs."""

from labdist import lab
from labdist.autodiff import GradientTape
from labdist.collectives import compression
from labdist.context import (
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
)
from labdist.data import dataset as data
from labdist.data import datasets
from labdist.data.distributed import InputContext, batches
from labdist.data.pipelines import InputOptions
from labdist.devices import to_host
from labdist.enums import (
    InputReplicationMode,
    ReduceOp,
    VariableAggregation,
    VariableSynchronization,
)
from labdist.errors import (
    ClusterConnectionError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    LabdistError,
    OutOfRangeError,
    ParameterServerLostError,
    PeerAbortedError,
    QuorumLostError,
    ReplicaDivergenceWarning,
    ReplicaLostError,
    ReplicaUnresponsiveError,
    SaveError,
)
from labdist.lab import Lab
from labdist.network import NetworkModel
from labdist.parameter_server import ClusterCoordinator, ParameterServerStrategy
from labdist.quorum.training import MembershipChange
from labdist.replica.replica_context import ReplicaContext
from labdist.strategies import (
    MirroredStrategy,
    MultiWorkerMirroredStrategy,
    OneDeviceStrategy,
    Strategy,
)
from labdist.tf_compat import (
    add_n,
    bool_,
    cast,
    constant,
    exp,
    float16,
    float32,
    float64,
    function,
    int8,
    int16,
    int32,
    int64,
    log,
    matmul,
    maximum,
    reduce_mean,
    reduce_sum,
    sqrt,
    square,
    uint8,
)
from labdist.timing.trace import profile
from labdist.training import callbacks, layers, losses, metrics, nn, optimizers, regularizers
from labdist.training import checkpoint as train
from labdist.training import model as models
from labdist.training.layers import Input
from labdist.training.model import Sequential
from labdist.values import PerReplica, ValueContext
from labdist.variables import Variable

bool = bool_
__version__ = "0.1.0"

__all__ = [
    "ClusterConnectionError",
    "ClusterCoordinator",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "GradientTape",
    "Input",
    "InputContext",
    "InputOptions",
    "InputReplicationMode",
    "Lab",
    "LabdistError",
    "MembershipChange",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "NetworkModel",
    "OneDeviceStrategy",
    "OutOfRangeError",
    "ParameterServerLostError",
    "ParameterServerStrategy",
    "PeerAbortedError",
    "PerReplica",
    "QuorumLostError",
    "ReduceOp",
    "ReplicaContext",
    "ReplicaDivergenceWarning",
    "ReplicaLostError",
    "ReplicaUnresponsiveError",
    "SaveError",
    "Sequential",
    "Strategy",
    "ValueContext",
    "Variable",
    "VariableAggregation",
    "VariableSynchronization",
    "add_n",
    "batches",
    "callbacks",
    "cast",
    "compression",
    "constant",
    "data",
    "datasets",
    "exp",
    "float16",
    "float32",
    "float64",
    "function",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
    "int8",
    "int16",
    "int32",
    "int64",
    "lab",
    "layers",
    "log",
    "losses",
    "matmul",
    "maximum",
    "metrics",
    "models",
    "nn",
    "optimizers",
    "profile",
    "reduce_mean",
    "reduce_sum",
    "regularizers",
    "sqrt",
    "square",
    "to_host",
    "train",
    "uint8",
]
