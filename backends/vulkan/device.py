"""The Vulkan device layer: instance, device and queue, kernels (compute pipelines with push
constants), descriptor sets, and one-shot commands for transfers.

Creating an instance and a device is the slow, driver-bound part, so a process keeps one
VulkanDevice (`shared_device()`) and every backend made after the first reuses it and its
compiled kernels. What a backend allocates (memory, descriptor sets, command buffers) it owns
and frees itself: see memory.py and program.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from mnngpu.errors import BackendUnavailableError
from mnngpu.shaders import shader_path

WHOLE_SIZE = 0xFFFFFFFFFFFFFFFF  # vk.VK_WHOLE_SIZE overflows the binding's cffi conversion
PUSH_CONSTANT_BYTES = 128        # the least every Vulkan device guarantees
FENCE_TIMEOUT_NS = 600 * 10**9
DEVICE_ENV = "MNNGPU_VULKAN_DEVICE"  # index into vkEnumeratePhysicalDevices, to pick one
CPU_DEVICE = 4                        # VK_PHYSICAL_DEVICE_TYPE_CPU

INSTALL_HINT = ("install a Vulkan loader and driver: on Debian/Ubuntu `apt install libvulkan1 mesa-vulkan-drivers` "
                "(lavapipe, a CPU driver) or your GPU vendor's driver, and `pip install 'mnngpu[vulkan]'`")

# physical device types, best first: discrete, integrated, virtual, CPU, other
DEVICE_PREFERENCE = (2, 1, 3, 4, 0)


def import_vulkan():
    """The `vulkan` binding module; it fails to import without the package or the loader library."""
    try:
        import vulkan
    except ImportError as exc:
        raise BackendUnavailableError(f"the `vulkan` Python package is missing ({exc}); {INSTALL_HINT}",
                                      field="backend_type") from exc
    except OSError as exc:
        raise BackendUnavailableError(f"the Vulkan loader library libvulkan.so.1 was not found; {INSTALL_HINT}",
                                      field="backend_type") from exc
    return vulkan


@dataclass
class Kernel:
    """One compute shader, ready to dispatch: its pipeline and the layouts that bind it."""

    name: str
    bindings: int
    pipeline: Any
    layout: Any
    set_layout: Any


class VulkanDevice:
    def __init__(self):
        vk = self.vk = import_vulkan()
        self.instance = self._create_instance()
        self.physical = self._pick_physical_device()
        props = vk.vkGetPhysicalDeviceProperties(self.physical)
        self.name = props.deviceName
        self.is_cpu = props.deviceType == CPU_DEVICE   # lavapipe: barriers and shared memory are slow
        self.api_version = props.apiVersion
        self.driver_version = props.driverVersion
        self.max_binding_bytes = int(props.limits.maxStorageBufferRange)
        self.max_groups = int(props.limits.maxComputeWorkGroupCount[0])
        self.max_invocations = int(props.limits.maxComputeWorkGroupInvocations)   # Vulkan guarantees 128
        self.min_offset_alignment = int(props.limits.minStorageBufferOffsetAlignment)
        self.fp16 = self._supports_fp16()
        self.queue_family = self._compute_queue_family()
        self.device = self._create_device()
        self.queue = vk.vkGetDeviceQueue(self.device, self.queue_family, 0)
        self.memory_properties = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        self.command_pool = self.create_command_pool()
        self.fence = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(), None)
        self._kernels: dict[str, Kernel] = {}

    # ---- creation -----------------------------------------------------------------------------
    def _create_instance(self):
        vk = self.vk
        app = vk.VkApplicationInfo(pApplicationName="mnngpu", pEngineName="mnngpu",
                                   apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))
        try:
            return vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
        except vk.VkError as exc:
            raise BackendUnavailableError(f"no Vulkan driver could create an instance ({type(exc).__name__}); "
                                          f"{INSTALL_HINT}", field="backend_type") from exc

    def _pick_physical_device(self):
        vk = self.vk
        devices = list(vk.vkEnumeratePhysicalDevices(self.instance))
        if not devices:
            raise BackendUnavailableError(f"the Vulkan loader found no device; {INSTALL_HINT}", field="backend_type")
        wanted = os.environ.get(DEVICE_ENV)
        if wanted is not None:
            if not wanted.isdigit() or int(wanted) >= len(devices):
                raise BackendUnavailableError(f"{DEVICE_ENV}={wanted!r}: expected an index below {len(devices)}",
                                              field=DEVICE_ENV)
            return devices[int(wanted)]
        rank = {kind: i for i, kind in enumerate(DEVICE_PREFERENCE)}
        return min(devices, key=lambda d: rank.get(vk.vkGetPhysicalDeviceProperties(d).deviceType, len(rank)))

    def _feature_chain(self, fp16: bool = False):
        """Vulkan 1.2 feature structs: to query (all off), or to enable fp16 storage."""
        vk = self.vk
        on = vk.VK_TRUE if fp16 else vk.VK_FALSE
        f12 = vk.VkPhysicalDeviceVulkan12Features(shaderFloat16=on)
        f11 = vk.VkPhysicalDeviceVulkan11Features(pNext=f12, storageBuffer16BitAccess=on)
        return vk.VkPhysicalDeviceFeatures2(pNext=f11), f11, f12

    def _supports_fp16(self) -> bool:
        """fp16 storage needs Vulkan 1.2's feature structs, shaderFloat16 and 16-bit storage buffers."""
        if self.api_version < self.vk.VK_MAKE_VERSION(1, 2, 0):
            return False
        features, f11, f12 = self._feature_chain()
        self.vk.vkGetPhysicalDeviceFeatures2(self.physical, features)
        return bool(f12.shaderFloat16 and f11.storageBuffer16BitAccess)

    def _compute_queue_family(self) -> int:
        vk = self.vk
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        for index, family in enumerate(families):
            if family.queueFlags & vk.VK_QUEUE_COMPUTE_BIT:
                return index
        raise BackendUnavailableError(f"Vulkan device {self.name} has no compute queue; {INSTALL_HINT}",
                                      field="backend_type")

    def _create_device(self):
        vk = self.vk
        chain = self._feature_chain(fp16=True) if self.fp16 else (None,)
        features = chain[0]
        queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.queue_family, queueCount=1, pQueuePriorities=[1.0])
        info = vk.VkDeviceCreateInfo(pNext=features, queueCreateInfoCount=1, pQueueCreateInfos=[queue])
        try:
            return vk.vkCreateDevice(self.physical, info, None)
        except vk.VkError as exc:
            raise BackendUnavailableError(f"Vulkan device {self.name} refused to open ({type(exc).__name__}); "
                                          f"{INSTALL_HINT}", field="backend_type") from exc

    def create_command_pool(self):
        vk = self.vk
        return vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(
            queueFamilyIndex=self.queue_family, flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT), None)

    # ---- kernels ------------------------------------------------------------------------------
    def kernel(self, name: str, bindings: int) -> Kernel:
        """The compute pipeline of shaders/vulkan/<name>.spv with `bindings` storage buffers
        (bindings 0 .. n-1 of set 0) and the push-constant range; compiled once per process."""
        kernel = self._kernels.get(name)
        if kernel is None:
            kernel = self._kernels[name] = self._create_kernel(name, bindings)
        return kernel

    def _create_kernel(self, name: str, bindings: int) -> Kernel:
        vk = self.vk
        path = shader_path("vulkan", f"{name}.spv")
        if not path.exists():
            raise BackendUnavailableError(f"shader {path.name} is missing from this mnngpu install "
                                          "(run python -m tools.build_shaders in a checkout)", path=path)
        code = path.read_bytes()
        module = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code), None)
        slots = [vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                 descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                 for i in range(bindings)]
        set_layout = vk.vkCreateDescriptorSetLayout(
            self.device, vk.VkDescriptorSetLayoutCreateInfo(bindingCount=bindings, pBindings=slots), None)
        push = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=PUSH_CONSTANT_BYTES)
        layout = vk.vkCreatePipelineLayout(self.device, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[set_layout], pushConstantRangeCount=1, pPushConstantRanges=[push]), None)
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main")
        pipeline = vk.vkCreateComputePipelines(self.device, vk.VK_NULL_HANDLE, 1,
                                               [vk.VkComputePipelineCreateInfo(stage=stage, layout=layout)], None)[0]
        vk.vkDestroyShaderModule(self.device, module, None)
        return Kernel(name, bindings, pipeline, layout, set_layout)

    # ---- submission ---------------------------------------------------------------------------
    def submit(self, command_buffers: list) -> None:
        """Run the command buffers in order and wait until they are done."""
        vk = self.vk
        info = vk.VkSubmitInfo(commandBufferCount=len(command_buffers), pCommandBuffers=command_buffers)
        vk.vkQueueSubmit(self.queue, 1, [info], self.fence)
        vk.vkWaitForFences(self.device, 1, [self.fence], vk.VK_TRUE, FENCE_TIMEOUT_NS)
        vk.vkResetFences(self.device, 1, [self.fence])

    def run_once(self, record) -> None:
        """Record a throwaway command buffer with `record(cb)`, submit it and wait."""
        vk = self.vk
        cb = vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
            commandPool=self.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        record(cb)
        vk.vkEndCommandBuffer(cb)
        try:
            self.submit([cb])
        finally:
            vk.vkFreeCommandBuffers(self.device, self.command_pool, 1, [cb])

    def barrier(self, cb, src_stage: int, src_access: int, dst_stage: int, dst_access: int) -> None:
        vk = self.vk
        memory = vk.VkMemoryBarrier(srcAccessMask=src_access, dstAccessMask=dst_access)
        vk.vkCmdPipelineBarrier(cb, src_stage, dst_stage, 0, 1, [memory], 0, None, 0, None)

    def memory_type(self, type_bits: int, required: int, preferred: int = 0) -> int | None:
        """A memory type index allowed by `type_bits` with all `required` flags, best with `preferred`."""
        props = self.memory_properties
        allowed = [i for i in range(props.memoryTypeCount)
                   if type_bits & (1 << i) and props.memoryTypes[i].propertyFlags & required == required]
        if not allowed:
            return None
        return max(allowed, key=lambda i: (props.memoryTypes[i].propertyFlags & preferred == preferred,
                                           props.memoryHeaps[props.memoryTypes[i].heapIndex].size))

    def heap_size(self, memory_type: int) -> int:
        props = self.memory_properties
        return int(props.memoryHeaps[props.memoryTypes[memory_type].heapIndex].size)


_shared: VulkanDevice | None = None


def shared_device() -> VulkanDevice:
    """The process's VulkanDevice, created on first use; BackendUnavailableError when there is none."""
    global _shared
    if _shared is None:
        _shared = VulkanDevice()
    return _shared
