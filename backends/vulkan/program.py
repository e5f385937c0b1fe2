"""Recorded work: dispatches grouped into segments, each recorded once into a command buffer
and resubmitted every step.

An Execution's onResize adds Dispatches to the backend's open segment. A segment closes where
the backend declines an op (the CPU backup then runs it between two submits) and at the end of
a resize, when its command buffer is recorded. Executing a step only marks its segment due;
the backend submits the due segments at finish(), or before a download another backend needs.
Values that change per step (the KV length) are read by the kernels from a small buffer the
host writes before the submit: push constants are frozen into the recording.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from mnngpu.backends.vulkan.device import Kernel, VulkanDevice
from mnngpu.backends.vulkan.memory import DeviceTensor

SETS_PER_POOL = 256


@dataclass(eq=False)
class Dispatch:
    kernel: Kernel
    bindings: list[DeviceTensor]  # bound to bindings 0 .. n-1, in order
    push: bytes
    groups: tuple[int, int, int]
    writes: tuple[int, ...] = (-1,)  # indices of the bindings it writes (negative: from the end); the rest are read


def grid(n_groups: int, max_x: int) -> tuple[int, int, int]:
    """Workgroup counts for `n_groups` groups; past the x limit the kernel's group_index()
    reads a 2-D grid row by row (and returns for the overhang)."""
    n_groups = max(1, int(n_groups))
    width = min(n_groups, max_x)
    return width, -(-n_groups // width), 1


def pack_push(fmt: str, *values) -> bytes:
    """Push constants as the shader's std430 block of 4-byte scalars (struct format letters)."""
    return struct.pack("<" + fmt, *values)


class DescriptorAllocator:
    """Descriptor sets for one backend's dispatches, from pools it creates as it goes."""

    def __init__(self, device: VulkanDevice):
        self.device = device
        self.pools: list = []
        self._left = 0

    def allocate(self, kernel: Kernel):
        vk, dev = self.device.vk, self.device.device
        if self._left == 0:
            size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=SETS_PER_POOL * 8)
            self.pools.append(vk.vkCreateDescriptorPool(dev, vk.VkDescriptorPoolCreateInfo(
                maxSets=SETS_PER_POOL, poolSizeCount=1, pPoolSizes=[size]), None))
            self._left = SETS_PER_POOL
        self._left -= 1
        return vk.vkAllocateDescriptorSets(dev, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=self.pools[-1], descriptorSetCount=1, pSetLayouts=[kernel.set_layout]))[0]

    def release(self) -> None:
        for pool in self.pools:
            self.device.vk.vkDestroyDescriptorPool(self.device.device, pool, None)
        self.pools, self._left = [], 0


class CommandSegment:
    """Dispatches that run in one submit, in order; barriers only where one reads or writes
    what an earlier one since the last barrier wrote (or writes what it read)."""

    def __init__(self):
        self.dispatches: list[Dispatch] = []
        self.command_buffer = None

    def add(self, dispatch: Dispatch) -> None:
        if self.command_buffer is not None:
            raise RuntimeError("this segment's commands are already recorded")
        self.dispatches.append(dispatch)

    def tensors(self) -> list[DeviceTensor]:
        return [t for d in self.dispatches for t in d.bindings]

    def record(self, device: VulkanDevice, command_pool, descriptors: DescriptorAllocator) -> None:
        """Record the dispatches with their tensors' buffers now; again after a buffer moved
        (DeviceTensor.grow), replacing the command buffer recorded before."""
        vk = device.vk
        if self.command_buffer is not None:
            vk.vkFreeCommandBuffers(device.device, command_pool, 1, [self.command_buffer])
            self.command_buffer = None
        cb = vk.vkAllocateCommandBuffers(device.device, vk.VkCommandBufferAllocateInfo(
            commandPool=command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo())
        compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        read_write = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
        # earlier submits' shader writes and copies come before this one's reads
        device.barrier(cb, compute | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                       vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT, compute, read_write)
        written: set[int] = set()
        read: set[int] = set()
        for dispatch in self.dispatches:
            outputs = {id(dispatch.bindings[i].buffer) for i in dispatch.writes}
            inputs = {id(t.buffer) for t in dispatch.bindings} - outputs
            if (inputs | outputs) & written or outputs & read:
                device.barrier(cb, compute, vk.VK_ACCESS_SHADER_WRITE_BIT, compute, read_write)
                written, read = set(), set()
            written |= outputs
            read |= inputs
            self._record_dispatch(device, cb, dispatch, descriptors)
        device.barrier(cb, compute, vk.VK_ACCESS_SHADER_WRITE_BIT,
                       compute | vk.VK_PIPELINE_STAGE_TRANSFER_BIT | vk.VK_PIPELINE_STAGE_HOST_BIT,
                       read_write | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_HOST_READ_BIT)
        vk.vkEndCommandBuffer(cb)
        self.command_buffer = cb

    @staticmethod
    def _record_dispatch(device: VulkanDevice, cb, dispatch: Dispatch, descriptors: DescriptorAllocator) -> None:
        vk = device.vk
        kernel = dispatch.kernel
        if len(dispatch.bindings) != kernel.bindings:
            raise ValueError(f"kernel {kernel.name} takes {kernel.bindings} buffers, got {len(dispatch.bindings)}")
        descriptor_set = descriptors.allocate(kernel)
        writes = [vk.VkWriteDescriptorSet(
            dstSet=descriptor_set, dstBinding=i, descriptorCount=1, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=t.buffer.handle, offset=0, range=t.buffer.size)])
            for i, t in enumerate(dispatch.bindings)]
        vk.vkUpdateDescriptorSets(device.device, len(writes), writes, 0, None)
        vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.pipeline)
        vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.layout, 0, 1, [descriptor_set], 0, None)
        if dispatch.push:
            vk.vkCmdPushConstants(cb, kernel.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(dispatch.push),
                                  vk.ffi.from_buffer(dispatch.push))
        vk.vkCmdDispatch(cb, *dispatch.groups)
