"""What a batch plan is built from: buckets, token budget, pad policy, seed, order.

``BatchingConfig.predictable()`` pads every sample to its bucket's length
(fixed shapes per bucket: ``count x bucket_max <= token_budget``);
``BatchingConfig.throughput()`` pads to the longest sample of each
microbatch (``count x longest <= token_budget``, fewer padding tokens, a
different shape per microbatch). Both keep every accepted sample: there is
no ``drop_last``, so each sample that is not skipped is in exactly one
microbatch per epoch (the last microbatch of a bucket may be smaller).

``pack`` (a :class:`~umlos_cuda.batching.packing.config.PackingConfig`)
makes a packed plan: microbatches of ``token_budget // pack.max_length``
rows, each row several samples (:mod:`.packing`); ``overflow_max`` must then
fit in a row, so every accepted sample has one and the oversize policy stays
``refuse``. A plan records the separator's length only; its ids are given
when it is collated.

Three words name three choices (meta.json keeps its keys):

* ``stage`` (key ``sampling_mode``): which engine call gives the order, as
  the engine's mode string: the shuffled train order (default), the
  sequential eval order, or the streaming preset's order (within an epoch
  the same permutation as train, under its own ``sampler_config_hash``);
* ``order`` (key ``order``): which shuffle, a name of the sampling-mode
  registry, as a manifest's ``data.sampling_mode``;
* ``profile`` (key ``mode``): ``predictable`` or ``throughput``, the
  factory that made the config (informational; the pad policy decides).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ... import checks
from ...errors import UINT64_MAX
from ...manifest.core import DEFAULT_BLOCK_SIZE
from ...nextbatch import MODE_SEQUENTIAL, MODE_SHUFFLE
from ...modes import DEFAULT_MODE, get_mode, mode_names
from ...presets import MODE_STREAMING
from .buckets import MAX_LENGTH, BucketSpec, config_error
from ..packing.config import OversizePolicy, PackingConfig
from .overlong import OverlongConfig
from .splits import SplitConfig

#: The largest window: a window's interleaving draws are numbered ``w 2^32 + j``, so it holds fewer than 2^32.
MAX_WINDOW = 1 << 32
#: The engine calls a plan's order can come from: shuffled train, sequential, streaming preset.
PLAN_STAGES = (MODE_SHUFFLE, MODE_SEQUENTIAL, MODE_STREAMING)
#: The keys of a stored config (:meth:`BatchingConfig.to_dict`), each optional; the constructor checks the values.
_STORED = dict.fromkeys(("token_budget", "bucket_edges", "overflow_max", "min_length", "pad_policy", "mode", "seed",
                         "sampling_mode", "sampler_block_size", "order", "group_size", "overlong", "split", "window"),
                        checks.field(checks.anything))



class PadPolicy(str, enum.Enum):
    """How a microbatch is padded, hence how it is cut."""

    PAD_TO_BUCKET = "pad_to_bucket"  # predictable: every row is the bucket's length
    PAD_TO_MAX_IN_BATCH = "pad_to_max"  # throughput: rows are the longest sample's length

    @classmethod
    def parse(cls, value) -> PadPolicy:
        if isinstance(value, cls):
            return value
        for policy in cls:
            if value == policy.value:
                return policy
        raise config_error(f"pad_policy must be one of {', '.join(p.value for p in cls)}, got {value!r}")


class BatchingProfile(str, enum.Enum):
    """Which factory made a config: fixed shapes or fewest padding tokens."""

    PREDICTABLE = "predictable"
    THROUGHPUT = "throughput"


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """Everything that decides a plan besides the lengths (validated on construction).

    Args:
        token_budget: tokens a microbatch may hold after padding.
        bucket_edges, overflow_max, min_length: the :class:`BucketSpec`.
        pad_policy: :class:`PadPolicy` or its value.
        seed: the plan seed (uint64); it seeds the engine's epoch order.
        stage: one of :data:`PLAN_STAGES` (meta.json's ``sampling_mode``).
        sampler_block_size: the engine's block size (default 2^20).
        profile: ``"predictable"`` or ``"throughput"`` (meta.json's ``mode``);
            informational, the factories set it with the matching pad policy.
        pack: None (each sample its own padded row) or a :class:`PackingConfig`
            with ``separator_len`` but no ``separator_ids`` and the ``refuse`` oversize policy.
        order: the engine's sampling mode behind a shuffled order, a name of
            the mode registry (``block_affine``, ``feistel``, ``block_feistel``;
            docs/sampling-modes.md). ``stage`` chooses shuffled, sequential
            or streaming; ``order`` chooses which shuffle. Omitted
            from :meth:`to_dict` when it is the default, so plans built before
            it existed keep their fingerprints.
        group_size: 1 (default), or 2 for preference pairs: rows ``2p`` and
            ``2p + 1`` form pair ``p``, the order is the engine's over the
            pairs and both rows of a pair share a microbatch (:mod:`.groups`).
            Omitted from :meth:`to_dict` when 1, so every other plan keeps
            its bytes and fingerprint.
        overlong: None (default: samples above ``overflow_max`` are skipped
            by the buckets, as plans always did) or an
            :class:`~.overlong.OverlongConfig`: ``max_length`` (at most
            ``overflow_max``) and what longer samples become (truncated,
            split into pieces, or skipped; :mod:`.overlong`).
        split: None (every sample) or a :class:`~.splits.SplitConfig`: the
            plan takes one side of a train/validation split (:mod:`.splits`).
            ``overlong`` and ``split`` are in :meth:`to_dict` only when set.
        window: the plan's scope. None (default): each epoch is planned whole. ``W``: each epoch is planned a
            window of ``W`` positions of its order at a time, as a windowed plan plans it (docs/batching.md,
            "Windowed plans": the same microbatches); a whole plan so made is a windowed plan's microbatches
            held whole (``WindowedPlan.as_batch_plan``: ``plan shard``), and rebuilds
            and verifies as any plan. In :meth:`to_dict` only when set. Windows plan token-budget buckets,
            packed or not: no pairs, over-long policy or split yet.
    """

    token_budget: int = 4096
    bucket_edges: tuple[int, ...] = (128, 256, 512, 1024)
    overflow_max: int = 2048
    pad_policy: PadPolicy = PadPolicy.PAD_TO_MAX_IN_BATCH
    seed: int = 42
    stage: str = MODE_SHUFFLE
    sampler_block_size: int = DEFAULT_BLOCK_SIZE
    min_length: int = 1
    profile: BatchingProfile = BatchingProfile.THROUGHPUT
    pack: PackingConfig | None = None
    order: str = DEFAULT_MODE
    group_size: int = 1
    overlong: OverlongConfig | None = None
    split: SplitConfig | None = None
    window: int | None = None
    bucket_spec: BucketSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        spec = BucketSpec(self.bucket_edges, self.overflow_max, self.min_length)
        set_ = object.__setattr__
        set_(self, "bucket_spec", spec)
        set_(self, "bucket_edges", spec.edges)
        set_(self, "pad_policy", PadPolicy.parse(self.pad_policy))
        try:
            set_(self, "profile", BatchingProfile(self.profile))
        except ValueError:
            raise config_error(f"profile (meta.json's mode) must be predictable or throughput, "
                               f"got {self.profile!r}") from None
        budget = checks.integer(self.token_budget, "token_budget", 1, MAX_LENGTH, fail=config_error)
        if budget < spec.overflow_max:
            raise config_error(
                f"token_budget {budget} is below overflow_max {spec.overflow_max}: a sample of the longest "
                f"accepted length would not fit in any microbatch; raise the budget or lower overflow_max"
            )
        set_(self, "token_budget", budget)
        set_(self, "seed", checks.integer(self.seed, "seed", 0, UINT64_MAX, fail=config_error))
        set_(self, "sampler_block_size",
             checks.integer(self.sampler_block_size, "sampler_block_size", 1, UINT64_MAX, fail=config_error))
        checks.choice(self.stage, "stage (meta.json's sampling_mode)", PLAN_STAGES, fail=config_error)
        checks.choice(self.order, "order", mode_names(), fail=config_error)
        if self.pack is not None:
            self._check_pack()
        if self.overlong is not None:
            overlong = checks.instance(self.overlong, "overlong", OverlongConfig, fail=config_error,
                                       message="{name} must be None or an OverlongConfig, got {type}")
            if overlong.max_length > spec.overflow_max:
                raise config_error(f"overlong max_length {overlong.max_length} is above overflow_max "
                                   f"{spec.overflow_max}: pieces longer than overflow_max would be skipped by the "
                                   "buckets; lower max_length or raise overflow_max")
        if self.split is not None:
            checks.instance(self.split, "split", SplitConfig, fail=config_error,
                            message="{name} must be None or a SplitConfig, got {type}")
        self._check_group()
        if self.window is not None:
            set_(self, "window", checks.integer(self.window, "window", 1, MAX_WINDOW, fail=config_error))
            if self.group_size != 1 or self.overlong is not None or self.split is not None:
                raise config_error("a plan made by windows takes no preference pairs, over-long policy or split yet "
                                   "(a window plans token-budget buckets, packed or not)")

    def _check_group(self) -> None:
        group = checks.integer(self.group_size, "group_size", 1, 2, fail=config_error,
                               message="{name} must be 1 (rows on their own) or 2 (preference pairs), got {value!r}")
        object.__setattr__(self, "group_size", group)
        if group > 1 and (self.overlong is not None or self.split is not None):
            raise config_error("a plan of preference pairs takes no over-long policy or train/validation split yet "
                               "(both would have to keep a pair's two rows together); plan the pairs whole")
        if group > 1 and self.pack is None and self.token_budget < group * self.bucket_spec.overflow_max:
            raise config_error(f"token_budget {self.token_budget} is below group_size x overflow_max = {group} x "
                               f"{self.bucket_spec.overflow_max}: a pair of the longest accepted length would fit no "
                               "microbatch; raise the budget or lower overflow_max")

    def _check_pack(self) -> None:
        pack: PackingConfig = checks.instance(self.pack, "pack", PackingConfig, fail=config_error,
                                              message="{name} must be None or a PackingConfig, got {type}")
        if pack.separator_ids:
            raise config_error(f"a plan records the separator's length, not its ids {list(pack.separator_ids)}: "
                               f"give separator_len={pack.separator_len} and the ids when collating")
        if pack.oversize is not OversizePolicy.REFUSE:
            raise config_error(f"a plan's pack takes no oversize policy ({pack.oversize.value}): samples above "
                               "overflow_max are skipped and listed, and overflow_max fits in a row")
        if pack.max_length > self.token_budget:
            raise config_error(f"pack max_length {pack.max_length} is above the token budget {self.token_budget}: "
                               "a microbatch holds at least one row")
        if self.bucket_spec.overflow_max > pack.max_length:
            raise config_error(f"overflow_max {self.bucket_spec.overflow_max} is above pack max_length "
                               f"{pack.max_length}: a sample of the longest accepted length would fit no row; "
                               "lower overflow_max (longer samples are skipped and listed)")

    @property
    def sampling_mode(self) -> str:
        """The ``sampling_mode`` the engine reports for this plan's order: ``stage`` says which call
        (shuffled train, sequential, streaming; it is spelled with the block-affine mode's names)
        and ``order`` which mode family, so a Feistel plan's order is ``..._FEISTEL_V1``. A loaded
        plan's meta takes it from here rather than from ``stage``, which would name the block-affine
        mode whatever the order."""
        if self.stage == MODE_SEQUENTIAL:
            return MODE_SEQUENTIAL
        mode = get_mode(self.order)
        return mode.streaming_sampling_mode if self.stage == MODE_STREAMING else mode.train_sampling_mode

    @property
    def rows_per_microbatch(self) -> int | None:
        """Rows of a packed microbatch (None when the plan does not pack)."""
        return None if self.pack is None else self.token_budget // self.pack.max_length

    @classmethod
    def predictable(cls, token_budget: int = 4096, bucket_edges=(128, 256, 512, 1024), overflow_max: int = 2048,
                    seed: int = 42, **kwargs) -> BatchingConfig:
        """Fixed shapes: pad to the bucket's length."""
        return cls(token_budget, tuple(bucket_edges), overflow_max, PadPolicy.PAD_TO_BUCKET, seed,
                   profile=BatchingProfile.PREDICTABLE, **kwargs)

    @classmethod
    def throughput(cls, token_budget: int = 4096, bucket_edges=(128, 256, 512, 1024), overflow_max: int = 2048,
                   seed: int = 42, **kwargs) -> BatchingConfig:
        """Fewest padding tokens: pad to the longest sample of each microbatch."""
        return cls(token_budget, tuple(bucket_edges), overflow_max, PadPolicy.PAD_TO_MAX_IN_BATCH, seed,
                   profile=BatchingProfile.THROUGHPUT, **kwargs)

    def to_dict(self) -> dict:
        """Plain data, as meta.json's ``config`` stores it. ``pack`` is not
        here: meta.json keeps it apart as ``pack_config``
        (:meth:`PackingConfig.to_dict`), so unpacked plans hash as they always did."""
        return {
            "token_budget": self.token_budget,
            "bucket_edges": list(self.bucket_edges),
            "overflow_max": self.overflow_max,
            "min_length": self.min_length,
            "pad_policy": self.pad_policy.value,
            "mode": self.profile.value,
            "seed": self.seed,
            "sampling_mode": self.stage,
            "sampler_block_size": self.sampler_block_size,
            **({} if self.order == DEFAULT_MODE else {"order": self.order}),
            **({} if self.group_size == 1 else {"group_size": self.group_size}),
            **({} if self.overlong is None else {"overlong": self.overlong.to_dict()}),
            **({} if self.split is None else {"split": self.split.to_dict()}),
            **({} if self.window is None else {"window": self.window}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> BatchingConfig:
        """The config :meth:`to_dict` gave."""
        data = checks.record(data, {}, optional=_STORED, fail=config_error,
                             not_a_map="a batching config is a mapping, got {type}",
                             unknown=f"unknown batching config keys {{unknown_list}}; known: {sorted(_STORED)}")
        renamed = {"sampling_mode": "stage", "mode": "profile"}  # the on-disk keys of two attributes
        values = {renamed.get(key, key): value for key, value in data.items()}
        if "bucket_edges" in values and isinstance(values["bucket_edges"], list):
            values["bucket_edges"] = tuple(values["bucket_edges"])
        if "overlong" in values:
            values["overlong"] = OverlongConfig.from_dict(values["overlong"])
        if "split" in values:
            values["split"] = SplitConfig.from_dict(values["split"])
        return cls(**values)
