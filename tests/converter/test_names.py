"""Kernel span names (otlp/names.py; native/src/names.cpp the same) and device names.

The cases are real kernel names from the shared traces (../shared/traces), with the span name
each gets. Every shared trace's kernels must read apart in the 32 characters a tree shows. Both
engines must give the same text for any input: checked here on every shared-trace kernel name
and on random names, and on whole conversions by the byte comparisons of
test_native_vs_reference.py.
"""

from __future__ import annotations

import gzip
import itertools
import json
import random
import re
from pathlib import Path

import pytest
from conftest import KINETO_DIR

from otelprof.converter import native_available
from otelprof.otlp.names import NAME_LIMIT, VISIBLE, device_name, fold_kernel_name, hex_address

REAL = [
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
        "add<float> · vectorized_elementwise<4, Array<char*, 3>> · at::native",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, at::detail::Array<char*, 3> "
        ">(int, at::native::AddFunctor<float>, at::detail::Array<char*, 3>)",
        "Add<float> · vectorized_elementwise<4, Array<char*, 3>> · at::native",
    ),
    (  # an operation inside an operation inside a lambda: innermost first
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<at::native::AUnaryFunctor<float, "
        "float, float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, "
        "at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::"
        "{lambda(int)#1}>(int, at::native::gpu_kernel_impl<at::native::AUnaryFunctor<float, float, float, "
        "at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::AUnaryFunctor<"
        "float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1})",
        "Mul<float> · AUnary<float, float, float> · gpu · elementwise<128, 2> · at::native",
    ),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "nccl_AllReduce_RING_LL_Sum_float"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "nccl_SendRecv_RING_SIMPLE_Sum_int8_t"),
    (  # a lambda in X::operator(): X, with the lambda's parameter types
        "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4>)",
        "sum<float, float, float>(float, float) · ReduceOp<float, func_wrapper_t<float>, unsigned int, float, 4> · "
        "reduce<128, 4> · at::…",
    ),
    (  # (anonymous namespace), lambdas inside lambdas: the function that defines them
        "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar("
        "at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()"
        "() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, "
        "at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
        "at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::"
        "{lambda(float)#1}, at::detail::Array<char*, 2>)",
        "launch_clamp_scalar(float) · vectorized_elementwise<4, Array<char*, 2>> · at::native",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::threshold_kernel_impl<float>("
        "at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, at::detail::Array<char*, 3> >(int, "
        "at::native::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, "
        "at::detail::Array<char*, 3>)",
        "threshold<float>(float, float) · vectorized_elementwise<4, Array<char*, 3>> · at::native",
    ),
    (  # a function named only by noise words: its argument leads, the platform words after it
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nt_align4>("
        "cutlass_80_tensorop_s1688gemm_64x64_16x6_nt_align4::Params)",
        "s1688gemm_64x64_16x6_nt_align4 · cutlass_80_tensorop · Kernel · cutlass",
    ),
    (  # a cast in a template argument
        "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>("
        "cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)",
        "nchwToNhwc<float, float, float, false, true, 2> · cudnn::ops",
    ),
    (
        "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float, float, float, float, "
        "cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, "
        "float*, float*, float const*, float const*, float)",
        "bn_bw_1C11_new<float, float, float2, 512, true, 1> · cudnn",
    ),
    (
        "void fbgemm_gpu::permute_indices_weights_kernel<false, int, decltype(nullptr)>(int, int, int const*, "
        "decltype(nullptr) const*, int const*, int const*, int const*, int*, decltype(nullptr)*)",
        "permute_indices_weights<false, int, decltype(nullptr)> · fbgemm_gpu",
    ),
    (  # a return type that is no plain `void`
        "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, "
        "true, true, false, 7, cublasGemvParams<cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >("
        "cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float>, float>)",
        "kernel<…> · internal::gemvx",
    ),
    (
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true>(float*, float const*, int, "
        "int, int)",
        "softmax_warp_forward<float, float, float, 10, true>",
    ),
    (  # nsys (CloverLeaf): a lambda written [lambda(int, int) (instance 1)]; its list left empty
        "void clover::par_ranged2d_kernel<advec_mom_kernel(int, int, int, int, clover::Buffer2D<double> &, "
        "clover::Buffer1D<double> &, int, int, int)::[lambda(int, int) (instance 1)]>(clover::Range2d, T1)",
        "advec_mom(int, int) · par_ranged2d · clover",
    ),
    (  # AMD (MI300): names stay mangled
        "_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_34GridwiseGemm"
        "MultiD_xdl_cshuffle_v3INS_13tensor_layout4gemm8RowMajorENS6_11ColumnMajorENS_5TupleIJEEES7_ttftS",
        "grouped_conv_fwd_xdl_cshuffle_v3<…> · ck::tensor_operation::device",
    ),
    # flat names: platform words after, a tile moved within the first 32 characters
    ("volta_sgemm_128x32_nt", "sgemm_128x32_nt · volta"),
    ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", "scudnn_128x64_relu_medium_nn_v1 · cudnn_infer_volta"),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
        "__5x_cublas",
        "gemm_bf16bf16_tilesize64x64x64_bf16f32_f32_tn_n_warpgroupsize1x1x1_execute_segment_k_off__5x_cublas · "
        "sm90_xmma",
    ),
    (  # MIOpen (MI300)
        "igemm_wrw_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x16_wt32x32x8_ws1x1_wr2x2_ta1x4x1x2_1x4x1x64_tb1x4x1x2_1x4x1x64_"
        "vs1_gkgs",
        "igemm_wrw_gtcx3_bt128x128x16_nhwc_bf16_bx0_ex1_wt32x32x8_ws1x1_wr2x2_ta1x4x1x2_1x4x1x64_tb1x4x1x2_1x4x1x64_"
        "vs1_gkgs",
    ),
    (  # Tensile (MI300)
        "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT64x32x128_MI16x16x1_SN_LDSB1_AFC1_AFEM1",
        "Cijk_Alik_Bljk_BBS_MT64x32x128_BH_Bias_HA_S_SAV_UserArgs_MI16x16x1_SN_LDSB1_AFC1_AFEM1",
    ),
    # already short: unchanged
    ("triton_poi_fused_add_mul_0", "triton_poi_fused_add_mul_0"),
    ("", ""),
]


@pytest.mark.parametrize(("raw", "folded"), REAL, ids=[f[:40] for _, f in REAL])
def test_real_kernel_names(raw: str, folded: str) -> None:
    assert fold_kernel_name(raw) == folded
    if native_available():
        from otelprof import _native

        assert _native.fold_kernel_name(raw) == folded


def _fold(name: str) -> str:
    """``fold_kernel_name(name)``, the native engine's the same."""
    folded = fold_kernel_name(name)
    if native_available():
        from otelprof import _native

        assert _native.fold_kernel_name(name) == folded, name
    return folded


def test_edge_cases() -> None:
    assert _fold("Foo::operator()(int)") == "operator() · Foo"
    assert _fold("void k<1>(int) const") == "k<1>"
    assert _fold("void f<(a") == "void f<(a"  # unbalanced: only capped
    assert _fold("_Z3fooPf") == "foo"
    assert _fold("_Z") == "_Z"
    assert _fold("_ZN2ck6device12_GLOBAL__N_16kernelIfEEvv") == "kernel<…> · ck::device"
    assert _fold("_Z" + "1" * 5000) == "_Z" + "1" * (NAME_LIMIT - 3) + "…"  # a length no int() reads
    deep = "void k" + "<a" * 100_000 + ">" * 100_000 + "(int)"  # read recursively, it would exhaust the stack
    assert _fold(deep) == deep[: NAME_LIMIT - 1] + "…"
    assert _fold("void k" + "<a" * 32 + ">" * 32 + "(int)").startswith("k<a<a<")  # 32 deep: read
    long = "x" * 500
    assert _fold(long) == "x" * (NAME_LIMIT - 1) + "…"
    assert len(_fold("é" * 500)) == NAME_LIMIT
    assert _fold("void k<" + ", ".join(["float"] * 20) + ">(int)") == "k<…>"
    huge = "void at::k<" + ", ".join(f"at::native::Functor{i}<float, float>" for i in range(2000)) + ">(int)"
    assert _fold(huge) == "Functor0<float, float> · k<…> · at"


def test_noise_words() -> None:
    """kernel, functor, cuda, impl: any case, snake_case or CamelCase, with a dangling `_`."""
    assert _fold("void foo_kernel_cuda<int>(int)") == "foo<int>"
    assert _fold("void GammaBetaBackwardCUDAKernel_32x32<float>(int)") == "GammaBetaBackward_32x32<float>"
    assert _fold("void k<a::GeluCUDAKernelImpl(x&)::{lambda(float)#1}>(int)") == "Gelu(float) · k"
    assert _fold("void Kernel<int>(int)") == "Kernel<int>"  # nothing but noise: kept
    assert _fold("kernel_impl_CUDA") == "kernel_impl_CUDA"
    assert _fold("my_kernelette") == "my_kernelette"  # a word, not a part of one


def test_operations_lead() -> None:
    assert _fold("void v<4, ns::FillFunctor<float>, ns::Array<char*, 1> >(int)") == (
        "Fill<float> · v<4, Array<char*, 1>>"
    )
    assert _fold("void k<4, ns::f(int)::{lambda(c10::Half, float)#1}>(int)") == "f(Half, float) · k<4>"
    assert _fold("void k<ns::f()::{lambda()#1}>(int)") == "f · k"  # no parameters: none shown
    assert _fold("void r<ReduceOp<float, MaxOps<float>, int> >()") == "MaxOps<float> · ReduceOp<float, int> · r"
    # a generic function: its first argument when it is a name, else nothing lifted
    assert _fold("void ns::Kernel2<foo_bar>(Params)") == "foo_bar · Kernel2 · ns"
    assert _fold("void ns::kernel<int, foo>(Params)") == "kernel<int, foo> · ns"
    # the first callable depth first, then the first inside it
    assert _fold("void k<A<B<xOp<C<yFunctor<int>>>>>, zOp>()") == "y<int> · xOp<C> · k<A<B>, zOp>"


def test_platform_words_and_tiles() -> None:
    assert _fold("sm80_xmma_x") == "x · sm80_xmma"
    assert _fold("gfx942_cutlass_80_train_conv") == "conv · gfx942_cutlass_80_train"
    assert _fold("volta") == "volta"
    assert _fold("volta_") == "volta_"  # nothing would be left
    assert _fold("train_volta_step") == "train_volta_step"  # only a platform word starts a run
    assert _fold("sm_80_x") == "sm_80_x"
    # a tile token ending past the 32nd character moves to the latest boundary where it ends within it
    moved = _fold("aaaaaaaaaa_bbbbbbbbbb_cccccccccc_64x64")
    assert moved == "aaaaaaaaaa_bbbbbbbbbb_64x64_cccccccccc" and moved.index("64x64") + 5 <= VISIBLE
    assert _fold("averyveryveryverylongfirsttoken_x_64x64") == "averyveryveryverylongfirsttoken_64x64_x"
    assert _fold("aaaaaaaaaa_bbbbbbbbbb_cccc_64x64") == "aaaaaaaaaa_bbbbbbbbbb_cccc_64x64"  # ends at 32
    assert _fold("64x64_" + "a" * 40 + "_32x32") == "64x64_" + "a" * 40 + "_32x32"  # the first is first


def _shared_kernel_names(path: Path) -> list[str]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return sorted(
        {e["name"] for e in events if e.get("cat") in ("kernel", "Kernel") and isinstance(e.get("name"), str)}
    )


def _gpu_traces() -> list[object]:
    traces = sorted(KINETO_DIR.glob("*.json.gz")) if KINETO_DIR.is_dir() else []
    return [
        pytest.param(p, marks=[pytest.mark.slow] if p.stat().st_size > 500_000 else [], id=p.name.split("__")[-1][:40])
        for p in traces
        if "cpu_only" not in p.name
    ] or [pytest.param(None, marks=pytest.mark.skip(reason="no shared traces"))]


@pytest.mark.parametrize("trace", _gpu_traces())
def test_kernels_of_a_trace_read_apart_in_32_characters(trace: Path) -> None:
    """Issue 33's measure: of the pairs of a trace's kernels whose span names differ, at least
    95 % differ in their first 32 characters; different kernels rarely get one span name."""
    names = _shared_kernel_names(trace)
    assert len(names) > 5
    folded = {n: fold_kernel_name(n) for n in names}
    apart = alike = same = 0
    for a, b in itertools.combinations(names, 2):
        if folded[a] == folded[b]:
            same += 1
        elif folded[a][:VISIBLE] == folded[b][:VISIBLE]:
            alike += 1
        else:
            apart += 1
    assert apart / (apart + alike) >= 0.95, (apart, alike)
    assert same <= 0.005 * (apart + alike + same), same
    assert all(len(f) <= NAME_LIMIT for f in folded.values())
    if native_available():
        from otelprof import _native

        assert [_native.fold_kernel_name(n) for n in names] == [folded[n] for n in names]


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
        *"<>()[]{}:, _abIN0123456789xX",
        "(anonymous namespace)::", "operator()", "decltype", "…", "é", "İ", " const", "_Z", "_ZN", "_GLOBAL__N_1",
        "\t", "\u00a0", "void ", "at::native::", "float", "int", "unsigned ",
        "kernel", "Kernel", "Kernel2<", "Functor", "CUDA", "_impl", "Op", "{lambda(", "[lambda(", ")#1}",
        "::{lambda(float)#1}", "(int)::", "sm80_", "SM90", "gfx942_", "cutlass_80_", "volta_", "infer_", "128x64",
        "_bt64x32x8", "tilesize128x128x32_",
    ]  # fmt: skip
    for _ in range(20000):
        name = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 80)))
        folded = fold_kernel_name(name)
        assert _native.fold_kernel_name(name) == folded, name
        assert len(folded) <= NAME_LIMIT
    for t in range(-2, 24):
        for d in (None, -1, 0, 3):
            assert _native.device_name(t, d) == device_name(t, d), (t, d)


_IDS = [
    "kernel", "Kernel", "CUDAFunctor_add", "ReduceOp", "MaxOps", "gpu_kernel_impl", "float", "unsigned int", "Array",
    "foo", "Bar2", "x", "_", "é", "Kernel2", "char*", "decltype(nullptr)", "operator()", "4", "true",
    "cutlass_80_tensorop_s1688gemm_128x128_16x5_nn_align4", "volta_sgemm_128x64_nn",
    "sm80_xmma_fprop_implicit_gemm_tf32f32_tilesize128x128x16_stage4", "cudnn_infer_volta_scudnn_128x64",
    "igemm_wrw_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x16_wt32x32x8", "Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_MT64x32x128",
]  # fmt: skip


def _kernel_like(rng: random.Random) -> str:
    """A random demangled signature: nested templates, lambdas, casts, namespaces."""

    def name(depth: int) -> str:
        s = rng.choice(["", "", "at::native::", "cub::", "(anonymous namespace)::"]) + rng.choice(_IDS)
        if depth < 4 and rng.random() < 0.4:
            s += "<" + ", ".join(arg(depth + 1) for _ in range(rng.randint(1, 5))) + rng.choice([">", " >"])
        return s

    def arg(depth: int) -> str:
        r = rng.random()
        if r < 0.2:
            return str(rng.randint(0, 1024))
        if r < 0.3:
            return f"({name(depth)}){rng.randint(0, 9)}"
        if r < 0.55:
            params = ", ".join(name(depth + 1) for _ in range(rng.randint(0, 3)))
            local = rng.choice(["{lambda(float)#1}", "{lambda(float, c10::Half)#2}", "[lambda(int) (instance 1)]",
                                "{lambda()#3}", "Params", "operator()() const::{lambda(int)#1}"])  # fmt: skip
            return f"{name(depth)}({params})::{local}"
        return name(depth)

    text = rng.choice(["void ", "", "std::enable_if<!(false), void>::type "]) + name(0)
    text += rng.choice(["(int, float*)", "", "(T1) const", "("])
    return text[: rng.randint(0, len(text))] if rng.random() < 0.05 else text


@pytest.mark.skipif(not native_available(), reason="otelprof._native is not built")
def test_native_matches_reference_on_random_signatures() -> None:
    from otelprof import _native

    rng = random.Random(33)
    for _ in range(5000):
        name = _kernel_like(rng)
        folded = fold_kernel_name(name)
        assert _native.fold_kernel_name(name) == folded, name
        assert len(folded) <= NAME_LIMIT
