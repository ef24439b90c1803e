"""Kernel name folding and device names (otlp/names.py; native/src/names.cpp the same).

The cases are real kernel names from the shared traces (../shared/traces), with the span name
each gets. Both engines must give the same text for any input: checked here on random names,
and on every shared trace by the byte comparisons of test_native_vs_reference.py.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from otelprof.converter import native_available
from otelprof.otlp.names import NAME_LIMIT, device_name, fold_kernel_name, hex_address

REAL = [
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
        "at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, Array<char*, 3>>",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, at::detail::Array<char*, 3> "
        ">(int, at::native::AddFunctor<float>, at::detail::Array<char*, 3>)",
        "at::native::vectorized_elementwise_kernel<4, AddFunctor<float>, Array<char*, 3>>",
    ),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "ncclKernel_AllReduce_RING_LL_Sum_float"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"),
    (
        "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4>)",
        "at::native::reduce_kernel<128, 4, ReduceOp<…>>",
    ),
    (  # (anonymous namespace), lambdas inside lambdas: the function that defines them
        "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar("
        "at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()"
        "() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, "
        "at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
        "at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::"
        "{lambda(float)#1}, at::detail::Array<char*, 2>)",
        "at::native::vectorized_elementwise_kernel<4, launch_clamp_scalar, Array<char*, 2>>",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::threshold_kernel_impl<float>("
        "at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, at::detail::Array<char*, 3> >(int, "
        "at::native::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, "
        "at::detail::Array<char*, 3>)",
        "at::native::vectorized_elementwise_kernel<4, threshold_kernel_impl<float>, Array<char*, 3>>",
    ),
    (
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nt_align4>("
        "cutlass_80_tensorop_s1688gemm_64x64_16x6_nt_align4::Params)",
        "cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nt_align4>",
    ),
    (  # a cast in a template argument
        "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>("
        "cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)",
        "cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, 2>",
    ),
    (
        "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float, float, float, float, "
        "cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, "
        "float*, float*, float const*, float const*, float)",
        "cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>",
    ),
    (
        "void fbgemm_gpu::permute_indices_weights_kernel<false, int, decltype(nullptr)>(int, int, int const*, "
        "decltype(nullptr) const*, int const*, int const*, int const*, int*, decltype(nullptr)*)",
        "fbgemm_gpu::permute_indices_weights_kernel<false, int, decltype(nullptr)>",
    ),
    (  # a return type that is no plain `void`
        "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, "
        "true, true, false, 7, cublasGemvParams<cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >("
        "cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float>, float>)",
        "internal::gemvx::kernel<…>",
    ),
    (
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true>(float*, float const*, int, "
        "int, int)",
        "softmax_warp_forward<float, float, float, 10, true>",
    ),
    (  # nsys (CloverLeaf): a lambda written [lambda(int, int) (instance 1)]
        "void clover::par_ranged2d_kernel<advec_mom_kernel(int, int, int, int, clover::Buffer2D<double> &, "
        "clover::Buffer1D<double> &, int, int, int)::[lambda(int, int) (instance 1)]>(clover::Range2d, T1)",
        "clover::par_ranged2d_kernel<advec_mom_kernel>",
    ),
    (  # AMD (MI300): names stay mangled
        "_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_34GridwiseGemm"
        "MultiD_xdl_cshuffle_v3INS_13tensor_layout4gemm8RowMajorENS6_11ColumnMajorENS_5TupleIJEEES7_ttftS",
        "ck::tensor_operation::device::kernel_grouped_conv_fwd_xdl_cshuffle_v3<…>",
    ),
    # already short: unchanged
    ("volta_sgemm_128x32_nt", "volta_sgemm_128x32_nt"),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
        "__5x_cublas",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
        "__5x_cublas",
    ),
    ("triton_poi_fused_add_mul_0", "triton_poi_fused_add_mul_0"),
    ("", ""),
]


@pytest.mark.parametrize(("raw", "folded"), REAL, ids=[f[:40] for _, f in REAL])
def test_real_kernel_names(raw: str, folded: str) -> None:
    assert fold_kernel_name(raw) == folded
    if native_available():
        from otelprof import _native

        assert _native.fold_kernel_name(raw) == folded


def test_edge_cases() -> None:
    assert fold_kernel_name("Foo::operator()(int)") == "Foo::operator()"
    assert fold_kernel_name("void k<1>(int) const") == "k<1>"
    assert fold_kernel_name("void f<(a") == "void f<(a"  # unbalanced: only capped
    assert fold_kernel_name("_Z3fooPf") == "foo"
    assert fold_kernel_name("_Z") == "_Z"
    long = "x" * 500
    assert fold_kernel_name(long) == "x" * (NAME_LIMIT - 1) + "…"
    assert len(fold_kernel_name("é" * 500)) == NAME_LIMIT
    assert fold_kernel_name("void k<" + ", ".join(["float"] * 20) + ">(int)") == "k<…>"


def test_device_names() -> None:
    assert device_name(0, -1) == "cpu"
    assert device_name(0, 0) == "cpu"
    assert device_name(1, 0) == "cuda:0"
    assert device_name(1, 7) == "cuda:7"
    assert device_name(1, None) == "cuda"
    assert device_name(1, -1) == "cuda"
    assert device_name(12, 1) == "xpu:1"
    assert device_name(13, 0) == "mps:0"
    assert device_name(20, 0) == "privateuseone:0"
    assert device_name(21, 0) is None
    assert device_name(-1, 0) is None
    assert hex_address(4096) == "0x1000"
    assert hex_address(0x7F12_3456_7890) == "0x7f1234567890"
    assert hex_address(-1) == "0xffffffffffffffff"


def test_device_types_match_torch() -> None:
    """The table follows c10::DeviceType (the profiler's ``Device Type`` is its number), read
    from the installed torch's header."""
    torch = pytest.importorskip("torch")
    from otelprof.otlp.names import DEVICE_TYPES

    include = Path(torch.__file__).parent / "include"
    headers = [include / "torch/headeronly/core/DeviceType.h", include / "c10/core/DeviceType.h"]
    text = "".join(h.read_text() for h in headers if h.is_file())
    enum = re.search(r"enum class DeviceType : int8_t \{(.*?)\};", text, re.S)
    if enum is None:
        pytest.skip("torch's DeviceType header is not installed")
    numbered = {int(n): name.lower() for name, n in re.findall(r"^\s*(\w+) = (\d+),", enum.group(1), re.M)}
    numbered.pop(max(numbered))  # COMPILE_TIME_MAX_DEVICE_TYPES
    numbered[20] = "privateuseone" if numbered.get(20) == "privateuse1" else numbered.get(20, "")
    assert numbered == dict(enumerate(DEVICE_TYPES))


@pytest.mark.skipif(not native_available(), reason="otelprof._native is not built")
def test_native_matches_reference_on_random_names() -> None:
    from otelprof import _native

    rng = random.Random(15)
    pieces = [
        *"<>()[]{}:, _abIN0123456789",
        "(anonymous namespace)::", "operator()", "decltype", "…", "é", " const", "_Z", "_ZN", "_GLOBAL__N_1",
        "\t", "\u00a0", "void ", "at::native::", "float",
    ]  # fmt: skip
    for _ in range(20000):
        name = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 80)))
        assert _native.fold_kernel_name(name) == fold_kernel_name(name), name
    for t in range(-2, 24):
        for d in (None, -1, 0, 3):
            assert _native.device_name(t, d) == device_name(t, d), (t, d)
