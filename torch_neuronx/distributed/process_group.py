"""``ProcessGroupNeuron``: the ``neuron`` c10d backend, a Python ``dist.ProcessGroup`` over gloo.

``dist.init_process_group("neuron")`` (or no backend, or ``"cpu:gloo,neuron:neuron"``) creates
one per group. Every collective of torch.distributed's API (and those c10d's C++ side calls:
DDP's reducer, functional collectives, FSDP2) arrives at a method here, is checked on this
rank before anything is exchanged, runs as an algorithm of :mod:`.algorithms` on the host views
of the tensors' device memory over torch.distributed's own transport (gloo), in the group's
program order (:mod:`.work`), ordered with the issuing stream.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from torch_neuronx import config
from torch_neuronx.distributed import algorithms, point_to_point, validate
from torch_neuronx.distributed.agreements import Agreements
from torch_neuronx.distributed.collective_queue import CollectiveError, CollectiveQueue, Task
from torch_neuronx.distributed.options import Options
from torch_neuronx.distributed.work import CoalescedWork, NeuronWork, issue, never_compiled, ready_point
from torch_neuronx.runtime import streams
from torch_neuronx.runtime.tensor import NeuronTensor

_log = logging.getLogger("torch_neuronx.distributed")


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What the ranks of a collective must agree on (see :func:`.validate.signature`)."""

    dtype: torch.dtype | None
    agreed: Sequence[int] = ()
    mine: Sequence[int] = ()
    expected: Sequence[Sequence[int]] | None = None  # every rank's ``mine``, as this rank sees it
    sends: Sequence[int] = ()
    receives: Sequence[int] = ()


def _numels(tensors: Sequence[torch.Tensor]) -> list[int]:
    return [t.numel() for t in tensors]


def _plain(t: torch.Tensor) -> torch.Tensor:
    """The host view of a neuron tensor's memory (a CPU tensor as is): a tensor of its own over the
    memory the neuron tensor has now, which a later storage resize (FSDP2's reshard) does not repoint."""
    return t._data.detach() if isinstance(t, NeuronTensor) else t


def _op_code(op: Any) -> int:
    """A reduce op as a number the ranks agree on (every rank must reduce with the same op)."""
    return int(algorithms.op_and_factor(op)[0])


def _first_dtype(tensors: Sequence[torch.Tensor]) -> torch.dtype | None:
    return tensors[0].dtype if tensors else None


def _dtype_codes(tensors: Sequence[torch.Tensor]) -> list[int]:
    """Every tensor's dtype as a number (the ranks of a multi-tensor collective agree on each)."""
    return [validate.dtype_code(t.dtype) for t in tensors]


def _flatten(values: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, list | tuple):
            out.extend(_flatten(v))
    return out


class _Closed:
    """A destroyed group's transport: whatever still uses it gets a clear error."""

    def __getattr__(self, name: str) -> Any:
        raise CollectiveError("the process group was destroyed (destroy_process_group)")


class _DeviceBackend:
    """What ``ProcessGroupNeuron._get_backend`` answers for ``neuron`` (c10d asks it when a group
    is bound to a device, ``init_process_group(device_id=neuron:i)``): a group that splits
    (:meth:`ProcessGroupNeuron.split_group`, which ``dist.split_group`` and a bound
    ``DeviceMesh`` call), with nothing to connect eagerly or to split on non-members."""

    supports_splitting = True
    options = None  # (c10d copies it into the split's options, which the split ignores)

    def name(self) -> str:
        return "neuron"

    def eager_connect_single_device(self, device: Any) -> None:
        """The transport connects when the group is made."""

    def perform_nocolor_split(self, device: Any) -> None:
        """Ranks outside a new group take no part in making it."""

    def _set_sequence_number_for_group(self) -> None:
        """Collectives are matched by each group's issue order."""


@never_compiled
class ProcessGroupNeuron(dist.ProcessGroup):
    """TorchNeuron's ``neuron`` process group: collectives on neuron (and CPU) tensors over gloo."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        self._store, self._timeout = store, timeout
        self._coalesced: list[dist.Work] | None = None  # inside ``_coalescing_manager(device=...)``
        self.options = Options.from_environment()
        self._transport = dist.ProcessGroupGloo(store, rank, size, timeout)
        # the agreement checks travel on connections of their own, so they can run ahead of the data
        self._agreements = Agreements(
            dist.ProcessGroupGloo(dist.PrefixStore("agreement", store), rank, size, timeout), rank, size)
        self._blocking = bool(config.get("NEURON_LAUNCH_BLOCKING"))
        self._timeout_s = timeout.total_seconds()
        self._name = ""
        self._desc = ""
        self._queue = CollectiveQueue(f"rank {rank}/{size}")
        # per stream: (the point the last collective waited for, the stream's end after its waits)
        self._awaits: dict[streams.Stream, tuple[int, int]] = {}

    # -- identity (c10d calls these) ----------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return "neuron"

    def name(self) -> str:
        return "neuron"

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name
        self._queue.name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    @property
    def _device_types(self) -> list[torch.device]:
        """The devices whose tensors this group moves (c10d's list of its backends' devices,
        empty for a group written in Python): FSDP's ``set_model_state_dict(...,
        broadcast_from_rank0=True)`` moves the state to the first of them and failed with an
        IndexError on the empty list."""
        return [torch.device("neuron"), torch.device("cpu")]

    @property
    def transport(self) -> dist.ProcessGroup:
        """The gloo process group that moves the bytes."""
        return self._transport

    def _get_backend(self, device: Any) -> Any:
        """The backend c10d asks for a device: for ``neuron``, one that cannot be split (torch asks
        it when ``init_process_group(device_id=neuron:i)`` binds the group to a device, and failed
        with "No backend type associated with device type neuron"); the collectives stay this
        group's."""
        if torch.device(device).type == "neuron":
            return _DeviceBackend()
        return super()._get_backend(device)

    def get_group_store(self) -> dist.Store:
        """The store this group was made with (c10d keeps a split group's)."""
        return self._store

    def split_group(self, ranks: Sequence[int], timeout: datetime.timedelta | None = None, opts: Any = None,
                    group_name: str | None = None, group_desc: str | None = None,
                    device_types: Any = None) -> ProcessGroupNeuron | None:
        """A new group of ``ranks`` (this group's ranks; None on a rank outside them), on
        connections of its own: what ``dist.split_group`` and a ``DeviceMesh`` over a bound group
        make. Every member calls it with the same ranks and name (c10d's hashed name)."""
        if self.rank() not in ranks:
            return None
        name = group_name or f"split{sorted(ranks)}"
        group = ProcessGroupNeuron(dist.PrefixStore(f"split/{name}/", self._store), list(ranks).index(self.rank()),
                                   len(ranks), timeout or self._timeout)
        group._set_group_name(name)
        group._set_group_desc(group_desc or f"{self._desc}:split")
        group.bound_device_id = self.bound_device_id
        return group

    def _start_coalescing(self, device: Any) -> None:
        """``_coalescing_manager(device=...)``: the collectives issued until :meth:`_end_coalescing`
        are waited for together."""
        if self._coalesced is not None:
            raise RuntimeError("_coalescing_manager: this process group is already coalescing")
        self._coalesced = []

    def _end_coalescing(self, device: Any) -> CoalescedWork:
        """The work of the collectives issued since :meth:`_start_coalescing`."""
        works, self._coalesced = self._coalesced or [], None
        return CoalescedWork(works)

    def shutdown(self) -> None:
        """``destroy_process_group``: the collectives this rank issued end first (queued ones run:
        the peers wait for them, as gloo's own group drains its queue when destroyed), then the
        agreement connections say goodbye and their threads end, and the transports close, so
        that a later ``init_process_group`` starts afresh."""
        unfinished = self._queue.finish_issued(self._timeout_s)
        if unfinished:
            _log.warning("destroy_process_group: %d collective(s) issued on this rank had not completed "
                         "after %g s (the first: %s); the peers' fail too", len(unfinished), self._timeout_s,
                         unfinished[0].describe())
        self._agreements.close()
        for group in (self._transport, self._agreements._transport):
            try:
                group.shutdown()
            except Exception as exc:  # noqa: BLE001 - a closed group must not fail the teardown
                _log.debug("shutting down a gloo group: %s", exc)
        # gloo closes its connections only when its group is freed; freed here, at once, whatever
        # still refers to this group (a caught error's frames): a peer whose transport holds a
        # collective this rank never joined (it ran ahead into a failed check) then fails it at
        # once, where it waited for the group's timeout (20 s, then 30 min by default) in its own
        # destroy_process_group.
        self._transport = _Closed()

    # -- issuing ------------------------------------------------------------------------------

    def _issue(self, kind: str, tensors: Sequence[torch.Tensor], outputs: list[Any],
               fn: Callable[[], Any], agree: Agreement | None = None, channel: int = 0,
               opts: Any = None) -> NeuronWork:
        """Queue ``fn`` (the algorithm on host views) in this group's order, after the neuron work
        producing ``tensors`` and before the work that consumes them; with ``agree``, the ranks
        check that they called the same collective on matching sizes (:class:`.agreements.Agreements`:
        the check is posted now, ahead of the data)."""
        check = None
        if agree is not None and self.size() > 1:
            check = self._agreements.post(kind, validate.signature(
                kind, agree.dtype, agree.agreed, agree.mine, self.size(), agree.sends, agree.receives), agree.expected)
        neuron = [t for t in tensors if isinstance(t, NeuronTensor)]
        ready: list[streams.Event] = []
        consumers: list[streams.Stream] = []
        if neuron:
            index = neuron[0]._index
            validate.same_device(kind, neuron, index)
            current = streams.current_stream(index)
            consumers = [current] if self.options.host_cc else list(dict.fromkeys(
                [current, streams.default_stream(index)]))
            ready = [self._ready(s) for s in consumers]
        nbytes = sum(t.nbytes for t in tensors)
        task = Task(kind, fn, ready, outputs, nbytes, self._name or "default", self._timeout_s, check)
        task.channel = channel
        work = issue(self._queue, task, neuron, consumers, blocking=self._blocking, inline=not self.options.host_cc,
                     asynchronous=bool(getattr(opts, "asyncOp", False)))
        self._after_issue(ready, consumers)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _ready(self, stream: streams.Stream) -> streams.Event:
        """The point of ``stream`` a new collective waits for: its current end, except the waits for
        this group's earlier collectives queued there last (the FIFO orders those already, and a
        ``recv`` must not wait for the ``send`` before it to complete)."""
        position = stream.position
        before, after = self._awaits.get(stream, (0, -1))
        return streams.Event.at(stream, ready_point(stream, before if position == after else position))

    def _after_issue(self, ready: Sequence[streams.Event], consumers: Sequence[streams.Stream]) -> None:
        for event, stream in zip(ready, consumers):
            self._awaits[stream] = (event._seq, stream.position)

    def _on_default_stream(self, tensors: Sequence[torch.Tensor]) -> bool:
        for t in tensors:
            if isinstance(t, NeuronTensor):
                return streams.current_stream(t._index).id == 0
        return True

    # -- reductions ---------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> NeuronWork:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        validate.dtypes("all_reduce", tensors)
        validate.contiguous("all_reduce", tensors)
        validate.reduce_op("all_reduce", op, tensors)
        plain = [_plain(t) for t in tensors]
        return self._issue("all_reduce", tensors, list(tensors), lambda: algorithms.all_reduce(
            self._transport, plain, op, self.size(), self.options.bucket_bytes),
            Agreement(tensors[0].dtype if tensors else None, [*_numels(tensors), _op_code(op)]), opts=opts)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> NeuronWork:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        validate.contiguous("all_reduce_coalesced", tensors)
        validate.reduce_op("all_reduce_coalesced", op, tensors)
        plain = [_plain(t) for t in tensors]
        return self._issue("all_reduce_coalesced", tensors, list(tensors), lambda: algorithms.all_reduce(
            self._transport, plain, op, self.size(), self.options.bucket_bytes),
            Agreement(_first_dtype(tensors), [*_numels(tensors), _op_code(op), *_dtype_codes(tensors)]), opts=opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> NeuronWork:
        validate.root("reduce", opts.rootRank, self.size())
        validate.contiguous("reduce", tensors)
        validate.reduce_op("reduce", opts.reduceOp, tensors)
        plain = _plain(tensors[0])
        return self._issue("reduce", tensors, list(tensors), lambda: algorithms.reduce(
            self._transport, plain, opts.rootRank, opts.reduceOp, self.size()),
            Agreement(tensors[0].dtype, [*_numels(tensors), opts.rootRank, _op_code(opts.reduceOp)]), opts=opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> NeuronWork:
        validate.root("broadcast", opts.rootRank, self.size())
        validate.contiguous("broadcast", tensors)
        plain = [_plain(t) for t in tensors]
        return self._issue("broadcast", tensors, list(tensors),
                           lambda: algorithms.broadcast(self._transport, plain, opts.rootRank),
                           Agreement(tensors[0].dtype if tensors else None, [*_numels(tensors), opts.rootRank]),
                           opts=opts)

    # -- gathers and scatters -----------------------------------------------------------------

    def _split_gather(self, tensors: Sequence[torch.Tensor]) -> bool:
        return Options.split(self.options.split_allgather, self._on_default_stream(tensors))

    def _split_scatter(self, tensors: Sequence[torch.Tensor]) -> bool:
        return Options.split(self.options.split_reduce_scatter, self._on_default_stream(tensors))

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> NeuronWork:
        validate.gather_base("all_gather_into_tensor", output, input, self.size())
        split = self._split_gather([output, input])
        out, inp = _plain(output), _plain(input)
        return self._issue("all_gather", [input, output], [output],
                           lambda: algorithms.all_gather_base(self._transport, out, inp, split),
                           Agreement(input.dtype, [input.numel()]), opts=opts)

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> NeuronWork:
        for output, input in zip(outputs, inputs, strict=True):
            validate.gather_base("all_gather_into_tensor_coalesced", output, input, self.size())
        split = self._split_gather(outputs)
        pairs = [(_plain(o), _plain(i)) for o, i in zip(outputs, inputs)]

        def run() -> None:
            for out, inp in pairs:
                algorithms.all_gather_base(self._transport, out, inp, split)
        return self._issue("all_gather_coalesced", [*inputs, *outputs], list(outputs), run,
                           Agreement(_first_dtype(inputs), [*_numels(inputs), *_dtype_codes(inputs)]), opts=opts)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> NeuronWork:
        validate.gather_lists("all_gather", output_lists, inputs, self.size())
        pairs = [([_plain(o) for o in outs], _plain(i)) for outs, i in zip(output_lists, inputs)]

        def run() -> None:
            for outs, inp in pairs:
                algorithms.all_gather(self._transport, outs, inp)
        if len(inputs) == 1:
            agree = Agreement(inputs[0].dtype, _numels(output_lists[0]), [inputs[0].numel()],
                              [[o.numel()] for o in output_lists[0]])
        else:  # each rank's own slots hold its inputs (checked here): the slots' sizes must agree
            validate.own_slots("all_gather", inputs, output_lists, self.rank())
            agree = Agreement(_first_dtype(inputs), [*_numels(_flatten(output_lists)), *_dtype_codes(inputs)])
        outputs = _flatten(output_lists)  # the future's value, as NCCL's and gloo's: one flat list
        return self._issue("all_gather", [*inputs, *outputs], outputs, run, agree, opts=opts)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> NeuronWork:
        validate.coalesced_gather("all_gather_coalesced", output_lists, inputs, self.size())
        pairs = [([_plain(lst[j]) for lst in output_lists], _plain(inp)) for j, inp in enumerate(inputs)]

        def run() -> None:
            for outs, inp in pairs:
                algorithms.all_gather(self._transport, outs, inp)
        outputs = _flatten(output_lists)
        return self._issue("all_gather_coalesced", [*inputs, *outputs], outputs, run,
                           Agreement(_first_dtype(inputs), [*_numels(inputs), *_dtype_codes(inputs)]), opts=opts)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> NeuronWork:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        validate.scatter_base("reduce_scatter_tensor", output, input, self.size())
        validate.reduce_op("reduce_scatter_tensor", op, [input])
        split = self._split_scatter([output, input])
        out, inp = _plain(output), _plain(input)
        return self._issue("reduce_scatter", [input, output], [output],
                           lambda: algorithms.reduce_scatter_base(self._transport, out, inp, op, split),
                           Agreement(output.dtype, [output.numel(), _op_code(op)]), opts=opts)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> NeuronWork:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        for output, input in zip(outputs, inputs, strict=True):
            validate.scatter_base("reduce_scatter_tensor_coalesced", output, input, self.size())
        validate.reduce_op("reduce_scatter_tensor_coalesced", op, inputs)
        split = self._split_scatter(outputs)
        pairs = [(_plain(o), _plain(i)) for o, i in zip(outputs, inputs)]

        def run() -> None:
            for out, inp in pairs:
                algorithms.reduce_scatter_base(self._transport, out, inp, op, split)
        return self._issue("reduce_scatter_coalesced", [*inputs, *outputs], list(outputs), run,
                           Agreement(_first_dtype(outputs), [*_numels(outputs), _op_code(op), *_dtype_codes(outputs)]),
                           opts=opts)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> NeuronWork:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        validate.scatter_lists("reduce_scatter", outputs, input_lists, self.size())
        validate.reduce_op("reduce_scatter", op, outputs)
        split = self._split_scatter(outputs)
        pairs = [(_plain(o), [_plain(t) for t in ins]) for o, ins in zip(outputs, input_lists)]

        def run() -> None:
            for out, ins in pairs:
                algorithms.reduce_scatter(self._transport, out, ins, op, split)
        if len(outputs) == 1:
            agree = Agreement(outputs[0].dtype, [*_numels(input_lists[0]), _op_code(op)], [outputs[0].numel()],
                              [[t.numel()] for t in input_lists[0]])
        else:  # each rank's own slots hold its outputs (checked here): the slots' sizes must agree
            validate.own_slots("reduce_scatter", outputs, input_lists, self.rank())
            agree = Agreement(_first_dtype(outputs), [*_numels(_flatten(input_lists)), _op_code(op),
                                                 *_dtype_codes(outputs)])
        return self._issue("reduce_scatter", [*outputs, *_flatten(input_lists)], list(outputs), run, agree, opts=opts)

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> NeuronWork:
        validate.root("gather", opts.rootRank, self.size())
        validate.rooted_lists("gather", output_lists, inputs, self.rank() == opts.rootRank, self.size())
        outs = [[_plain(o) for o in lst] for lst in output_lists]
        ins = [_plain(i) for i in inputs]
        options = dist.GatherOptions()
        options.rootRank = opts.rootRank
        return self._issue("gather", [*inputs, *_flatten(output_lists)], _flatten(output_lists),
                           lambda: self._transport.gather(outs, ins, options).wait(),
                           Agreement(inputs[0].dtype, [inputs[0].numel(), opts.rootRank]), opts=opts)

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> NeuronWork:
        validate.root("scatter", opts.rootRank, self.size())
        validate.rooted_lists("scatter", input_lists, outputs, self.rank() == opts.rootRank, self.size())
        outs = [_plain(o) for o in outputs]
        ins = [[_plain(i) for i in lst] for lst in input_lists]
        options = dist.ScatterOptions()
        options.rootRank = opts.rootRank

        def run() -> None:  # gloo writes a non-contiguous output as if it were contiguous: staged
            staged = [o if o.is_contiguous() else torch.empty(o.shape, dtype=o.dtype) for o in outs]
            self._transport.scatter(staged, [[i.contiguous() for i in lst] for lst in ins], options).wait()
            for out, stage in zip(outs, staged):
                if stage is not out:
                    out.copy_(stage)

        return self._issue("scatter", [*outputs, *_flatten(input_lists)], list(outputs), run,
                           Agreement(outputs[0].dtype, [outputs[0].numel(), opts.rootRank]), opts=opts)

    # -- all to all ---------------------------------------------------------------------------

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> NeuronWork:
        validate.all_to_all("all_to_all_single", output, input, output_split_sizes, input_split_sizes,
                            self.size())
        out, inp = _plain(output), _plain(input)
        native = self.options.native_alltoallv
        rows = input.shape[0] if input.dim() else 1
        sends = list(input_split_sizes) or algorithms.even_splits(rows, self.size())
        receives = list(output_split_sizes) or algorithms.even_splits(output.shape[0] if output.dim() else 1,
                                                                      self.size())
        return self._issue("all_to_all", [input, output], [output], lambda: algorithms.all_to_all_single(
            self._transport, out, inp, receives, sends, native),
            Agreement(input.dtype, [math.prod(input.shape[1:])], sends=sends, receives=receives), opts=opts)

    all_to_all_single = alltoall_base

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> NeuronWork:
        validate.list_lengths("all_to_all", outputs, inputs, self.size())
        outs, ins = [_plain(o) for o in outputs], [_plain(i) for i in inputs]
        native = self.options.native_alltoallv

        def run() -> None:
            send = torch.cat([i.reshape(-1) for i in ins])
            received = torch.empty(sum(o.numel() for o in outs), dtype=send.dtype)
            algorithms.all_to_all_single(self._transport, received, send, [o.numel() for o in outs],
                                         [i.numel() for i in ins], native)
            offset = 0
            for o in outs:
                o.copy_(received[offset:offset + o.numel()].view(o.shape))
                offset += o.numel()
        return self._issue("all_to_all", [*inputs, *outputs], list(outputs), run,
                           Agreement(inputs[0].dtype, [], sends=_numels(inputs), receives=_numels(outputs)), opts=opts)

    # -- point to point and barrier -----------------------------------------------------------

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> NeuronWork:
        validate.root("send", dst, self.size())
        validate.contiguous("send", tensors)
        validate.single("send", tensors)
        plain = _plain(tensors[0])
        return self._issue("send", tensors, list(tensors),
                           lambda: point_to_point.send(self._transport, plain, dst, tag))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> NeuronWork:
        validate.root("recv", src, self.size())
        validate.contiguous("recv", tensors)
        validate.single("recv", tensors)
        plain = _plain(tensors[0])
        return self._issue("recv", tensors, list(tensors),
                           lambda: point_to_point.recv(self._transport, plain, src, tag), channel=tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> NeuronWork:
        validate.contiguous("recv", tensors)
        validate.single("recv", tensors)
        plain = _plain(tensors[0])
        sources: list[int] = []
        work = self._issue("recv", tensors, list(tensors),
                           lambda: point_to_point.recv_anysource(self._transport, plain, tag, sources), channel=tag)
        work.sources = sources  # what ``_source_rank()`` answers once the receive ran
        return work

    def barrier(self, opts: Any = None) -> NeuronWork:
        # Checked as every collective is: a rank in a barrier while another calls a collective (or
        # the reverse) fails at once on both, where they waited out the group's timeout and then
        # reported a peer that never arrived.
        return self._issue("barrier", [], [], lambda: self._transport.barrier().wait(), Agreement(None), opts=opts)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        self._issue("barrier", [], [], lambda: self._transport.monitored_barrier(
            timeout or datetime.timedelta(seconds=self._timeout_s), wait_all_ranks)).wait()


_generation = 0  # default groups made in this process (init_process_group after destroy_process_group)


def create(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupNeuron:
    """The creator ``dist.Backend.register_backend("neuron", ...)`` calls for each new group.

    Its transports meet under a store prefix of their own per default group made in this
    process: torchrun's store outlives ``destroy_process_group``, and a group of the next
    ``init_process_group`` (c10d reuses its names, and its store barrier passes at once on the
    keys left behind) read the addresses the previous one left there, and hung past its timeout.
    Every rank makes its default groups in the same order, so the prefixes agree.
    """
    global _generation
    if dist.distributed_c10d._world.default_pg is None:  # making the default group
        _generation += 1
    return ProcessGroupNeuron(dist.PrefixStore(f"generation {_generation}/", store), rank, size, timeout)
