"""Device memory: arenas that place storage buffers inside large memory blocks, and
DeviceTensor, the handle a graph tensor holds.

Drivers cap the number of live allocations (4096 on many GPUs) while a model has thousands of
tensors, so an arena allocates memory in blocks and binds each buffer at an offset in one.
Where the device's memory is host-visible (lavapipe, integrated GPUs, resizable BAR) buffers
are written through a persistent mapping; otherwise through a staging buffer. Reads use the
mapping only where that memory is host-cached too: a CPU read of uncached memory (a discrete
GPU's BAR, or write-combined system memory) crawls, so those copy into a host-cached buffer
first.
"""

from __future__ import annotations

import numpy as np

from mnngpu.errors import BackendUnavailableError

FIRST_BLOCK_BYTES = 1 << 20   # blocks double from here up to BLOCK_BYTES, so a small backend stays small
BLOCK_BYTES = 64 << 20
MIN_BUFFER_BYTES = 16


class Buffer:
    """A VkBuffer bound inside an arena's block; `view` is its mapped bytes, or None; `cached`:
    the mapped memory is host-cached, so the CPU may read it through `view`."""

    def __init__(self, handle, size: int, view: memoryview | None, cached: bool = False):
        self.handle = handle
        self.size = size
        self.view = view
        self.cached = cached


class MemoryArena:
    """Storage buffers of one memory kind, freed together by release().

    host_visible: put them in host-visible coherent memory (for values written every step);
    otherwise device-local memory, mapped when that memory is host-visible too.
    readback: host-visible memory, host-cached where the device has it (for copies to read).
    staged: never use a mapping, always copy through a staging buffer (tests the GPU path)."""

    def __init__(self, device, host_visible: bool = False, staged: bool = False, readback: bool = False):
        self.device = device
        self.host_visible = host_visible or readback
        self.readback = readback
        self.staged = staged
        self._type: int | None = None
        self._blocks: list[tuple[object, memoryview | None]] = []
        self._block_used = 0
        self._block_size = 0
        self._buffers: list[object] = []
        self._transfer_arenas: dict[str, MemoryArena] = {}   # "staging" (copies in), "readback" (out)
        self._transfer_buffers: dict[str, Buffer] = {}

    # ---- allocation ---------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Buffer:
        vk, dev = self.device.vk, self.device.device
        size = max(MIN_BUFFER_BYTES, -(-int(nbytes) // 4) * 4)
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        handle = vk.vkCreateBuffer(dev, vk.VkBufferCreateInfo(size=size, usage=usage,
                                                              sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        self._buffers.append(handle)
        needs = vk.vkGetBufferMemoryRequirements(dev, handle)
        self._choose_type(needs.memoryTypeBits)
        align = max(int(needs.alignment), self.device.min_offset_alignment)
        offset = -(-self._block_used // align) * align
        if not self._blocks or offset + needs.size > self._block_size:
            grown = min(BLOCK_BYTES, FIRST_BLOCK_BYTES << len(self._blocks))
            self._new_block(max(grown, int(needs.size)))
            offset = 0
        memory, mapping = self._blocks[-1]
        vk.vkBindBufferMemory(dev, handle, memory, offset)
        self._block_used = offset + int(needs.size)
        view = None if mapping is None or self.staged else mapping[offset: offset + size]
        return Buffer(handle, size, view, cached=self._host_cached())

    def _host_cached(self) -> bool:
        flags = self.device.memory_properties.memoryTypes[self._type].propertyFlags
        return bool(flags & self.device.vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT)

    def _choose_type(self, type_bits: int) -> None:
        if self._type is not None and type_bits & (1 << self._type):
            return
        if self._type is not None:
            raise BackendUnavailableError(f"Vulkan device {self.device.name}: storage buffers need memory types "
                                          f"{type_bits:#x}, not the arena's type {self._type}", field="memory")
        self._type = self._pick_type(type_bits)

    def _pick_type(self, type_bits: int) -> int:
        vk, device = self.device.vk, self.device
        host = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        local = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
        if self.host_visible:
            cached = vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT if self.readback else 0
            chosen = device.memory_type(type_bits, host, preferred=cached)
        else:
            chosen = device.memory_type(type_bits, local)
            mappable = device.memory_type(type_bits, local | host)
            # mapped device memory only when it is all of the device's memory (not a 256 MiB BAR window)
            if chosen is not None and mappable is not None and device.heap_size(mappable) >= device.heap_size(chosen):
                chosen = mappable
            if chosen is None:
                chosen = device.memory_type(type_bits, 0)
        if chosen is None:
            raise BackendUnavailableError(f"Vulkan device {self.device.name} has no memory type for storage buffers",
                                          field="memory")
        return chosen

    def _new_block(self, nbytes: int) -> None:
        vk, dev = self.device.vk, self.device.device
        try:
            memory = vk.vkAllocateMemory(dev, vk.VkMemoryAllocateInfo(allocationSize=nbytes,
                                                                      memoryTypeIndex=self._type), None)
        except vk.VkError as exc:
            raise MemoryError(f"Vulkan device {self.device.name}: could not allocate {nbytes >> 20} MiB "
                              f"({type(exc).__name__})") from exc
        flags = self.device.memory_properties.memoryTypes[self._type].propertyFlags
        mapping = None
        if flags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT and flags & vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT:
            mapping = memoryview(vk.vkMapMemory(dev, memory, 0, nbytes, 0)).cast("B")
        self._blocks.append((memory, mapping))
        self._block_size = nbytes
        self._block_used = 0

    def release(self) -> None:
        """Destroy every buffer and free every block (the handles must no longer be in use)."""
        vk, dev = self.device.vk, self.device.device
        for helper in self._transfer_arenas.values():
            helper.release()
        for handle in self._buffers:
            vk.vkDestroyBuffer(dev, handle, None)
        for memory, mapping in self._blocks:
            if mapping is not None:
                vk.vkUnmapMemory(dev, memory)
            vk.vkFreeMemory(dev, memory, None)
        self._buffers, self._blocks, self._transfer_buffers = [], [], {}

    # ---- transfers ----------------------------------------------------------------------------
    def write(self, buffer: Buffer, data: np.ndarray, offset: int = 0) -> None:
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if buffer.view is not None:
            np.frombuffer(buffer.view, dtype=np.uint8, count=raw.size, offset=offset)[:] = raw
            return
        staging = self._transfer_buffer("staging", raw.size)
        np.frombuffer(staging.view, dtype=np.uint8, count=raw.size)[:] = raw
        self._copy(staging, 0, buffer, offset, raw.size)

    def read(self, buffer: Buffer, nbytes: int, offset: int = 0) -> np.ndarray:
        """A copy of `nbytes` bytes of the buffer, as uint8."""
        if buffer.view is not None and buffer.cached:
            return np.frombuffer(buffer.view, dtype=np.uint8, count=nbytes, offset=offset).copy()
        readback = self._transfer_buffer("readback", nbytes)
        self._copy(buffer, offset, readback, 0, nbytes)
        return np.frombuffer(readback.view, dtype=np.uint8, count=nbytes).copy()

    def copy(self, regions: list[tuple[Buffer, int, Buffer, int, int]]) -> None:
        """Device-side copies (src, src_offset, dst, dst_offset, nbytes), in order, with a barrier
        between them so that a later region may read what an earlier one wrote."""
        vk, device = self.device.vk, self.device

        def record(cb):
            for src, src_offset, dst, dst_offset, nbytes in regions:
                _transfer_barrier(device, cb, before=True)
                vk.vkCmdCopyBuffer(cb, src.handle, dst.handle, 1,
                                   [vk.VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset, size=nbytes)])
            _transfer_barrier(device, cb, before=False)

        device.run_once(record)

    def _copy(self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, nbytes: int) -> None:
        if nbytes:
            self.copy([(src, src_offset, dst, dst_offset, nbytes)])

    def _transfer_buffer(self, purpose: str, nbytes: int) -> Buffer:
        """A host-visible buffer of at least `nbytes` for copies in ("staging") or out ("readback")."""
        buffer = self._transfer_buffers.get(purpose)
        if buffer is None or buffer.size < nbytes:
            if purpose not in self._transfer_arenas:
                self._transfer_arenas[purpose] = MemoryArena(self.device, host_visible=True,
                                                             readback=purpose == "readback")
            buffer = self._transfer_arenas[purpose].allocate(max(nbytes, 1 << 20))
            self._transfer_buffers[purpose] = buffer
        return buffer


def _transfer_barrier(device, cb, before: bool) -> None:
    """Order a copy after earlier shader and copy work, or make its result visible to later work."""
    vk = device.vk
    work = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
    writes = vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
    reads = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT | writes
    if before:
        device.barrier(cb, work, writes, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, reads)
    else:
        device.barrier(cb, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                       work | vk.VK_PIPELINE_STAGE_HOST_BIT, reads | vk.VK_ACCESS_HOST_READ_BIT)


class DeviceTensor:
    """A tensor's device storage: `nbytes` of `dtype` elements (float16 when float tensors are
    stored at low precision). Memory is bound on first need, so that reshapes which alias their
    input, and host constants no kernel reads, never take any."""

    def __init__(self, arena: MemoryArena, nbytes: int, dtype: np.dtype):
        self.arena = arena
        self.nbytes = int(nbytes)
        self.dtype = np.dtype(dtype)
        self.buffer: Buffer | None = None
        self.pending: np.ndarray | None = None   # written before the memory existed

    def materialize(self) -> Buffer:
        if self.buffer is None:
            self.buffer = self.arena.allocate(self.nbytes)
            if self.pending is not None:
                self.arena.write(self.buffer, self.pending)
                self.pending = None
        return self.buffer

    def write(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        if values.nbytes != self.nbytes:
            raise ValueError(f"{values.nbytes} bytes for a {self.nbytes}-byte device tensor")
        if self.buffer is None:
            self.pending = values.copy()
        else:
            self.arena.write(self.buffer, values)

    def read(self) -> np.ndarray:
        """The elements, flat, in the storage dtype."""
        if self.buffer is None:
            if self.pending is not None:
                return self.pending.reshape(-1).copy()
            return np.zeros(self.nbytes // self.dtype.itemsize, dtype=self.dtype)
        return self.arena.read(self.buffer, self.nbytes).view(self.dtype)

    def read_range(self, offset: int, nbytes: int) -> np.ndarray:
        """Elements of `nbytes` bytes from byte `offset`, flat, in the storage dtype."""
        return self.arena.read(self.materialize(), nbytes, offset).view(self.dtype)

    def write_range(self, values: np.ndarray, offset: int) -> None:
        """Write `values` (of the storage dtype) from byte `offset` on."""
        self.arena.write(self.materialize(), np.ascontiguousarray(values, dtype=self.dtype), offset)

    def grow(self, nbytes: int) -> None:
        """Move into a larger buffer of `nbytes`, the current bytes first (the rest undefined). The
        old buffer's memory stays with the arena until release; commands that bound it must be
        recorded again."""
        old = self.materialize()
        self.buffer, self.nbytes = self.arena.allocate(nbytes), int(nbytes)
        self.arena.copy([(old, 0, self.buffer, 0, old.size)])
