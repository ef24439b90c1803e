"""Generates the Grafana dashboards in this folder from code (grafana-foundation-sdk 11.6).

    python dashboards/generate.py           # rewrite the JSON files
    python dashboards/generate.py --check   # exit 1 when a committed file differs

The JSON files are what users import; tests/dashboards checks that they match this generator,
runs every panel's PromQL against a real Prometheus scraping a real training run, and checks
their structure. Panels use the ``datasource`` / ``tempo`` variables, so they import into any
Grafana; the variables default to the uids provisioned by collector-config/grafana.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, dashboard, heatmap, prometheus, stat, table, tempo, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import BarGaugeDisplayMode, GraphDrawStyle, StackingMode, VizOrientation
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    GridPos,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

HERE = Path(__file__).resolve().parent

#: uids of the data sources that collector-config/grafana/provisioning/datasources provisions
PROMETHEUS_UID = "prometheus"
TEMPO_UID = "tempo"
PROM = DataSourceRef(type_val="prometheus", uid="${datasource}")
TEMPO = DataSourceRef(type_val="tempo", uid="${tempo}")

#: live-capture series carry run/rank/local_rank; Prometheus adds job and instance
SEL = 'job=~"$job", run=~"$run", rank=~"$rank", instance=~"$instance"'
#: the exporter's series are per process: no run or rank label
EXPORT_SEL = 'job=~"$job", instance=~"$instance"'
RATE = "$__rate_interval"


def _variables(board: dashboard.Dashboard) -> dashboard.Dashboard:
    board.with_variable(
        dashboard.DatasourceVariable("datasource")
        .label("Prometheus")
        .type("prometheus")
        .current(VariableOption(selected=True, text="Prometheus", value=PROMETHEUS_UID))
    ).with_variable(
        dashboard.DatasourceVariable("tempo")
        .label("Tempo")
        .type("tempo")
        .current(VariableOption(selected=True, text="Tempo", value=TEMPO_UID))
    )
    chain = [
        ("job", "Job", "label_values(otelprof_steps_total, job)"),
        ("run", "Run", 'label_values(otelprof_steps_total{job=~"$job"}, run)'),
        ("rank", "Rank", 'label_values(otelprof_steps_total{job=~"$job", run=~"$run"}, rank)'),
        (
            "instance",
            "Instance",
            'label_values(otelprof_steps_total{job=~"$job", run=~"$run", rank=~"$rank"}, instance)',
        ),
    ]
    for name, label, query in chain:
        board.with_variable(
            dashboard.QueryVariable(name)
            .label(label)
            .datasource(PROM)
            .query(query)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.NATURAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(VariableOption(selected=True, text="All", value="$__all"))
        )
    return board


def _prom(expr: str, legend: str = "__auto", *, instant: bool = False, exemplar: bool = False) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(expr).legend_format(legend).datasource(PROM)
    if instant:
        query.instant()
    if exemplar:
        query.exemplar(True)
    return query


def _targets(panel: Any, queries: Sequence[Builder[Any]]) -> Any:
    for ref, query in zip("ABCDEFGH", queries, strict=False):
        panel.with_target(query.ref_id(ref))  # type: ignore[attr-defined]
    return panel


class _Layout:
    """Places panels left to right in rows of 24 columns and numbers them from 1."""

    def __init__(self, board: dashboard.Dashboard) -> None:
        self.board = board
        self.next_id = 1
        self.x = 0
        self.y = 0
        self.row_height = 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> None:
        self._newline()
        self.board.with_row(dashboard.Row(title).id(self._id()).grid_pos(GridPos(h=1, w=24, x=0, y=self.y)))
        self.y += 1

    def add(self, panel: Any, w: int, h: int = 8) -> None:
        if self.x + w > 24:
            self._newline()
        panel.id(self._id()).grid_pos(GridPos(h=h, w=w, x=self.x, y=self.y))
        self.board.with_panel(panel)
        self.x += w
        self.row_height = max(self.row_height, h)

    def _newline(self) -> None:
        self.y += self.row_height
        self.x = 0
        self.row_height = 0


def _board(uid: str, title: str, description: str) -> tuple[dashboard.Dashboard, _Layout]:
    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["otelprof", "pytorch", "training"])
        .editable()
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(1)  # shared crosshair: ranks and phases line up in time
    )
    _variables(board)
    board.link(
        dashboard.DashboardLink("otelprof dashboards")
        .type("dashboards")
        .tags(["otelprof"])
        .as_dropdown(False)
        .include_vars(True)
        .keep_time(True)
    )
    return board, _Layout(board)


def _ts(title: str, unit: str, *queries: prometheus.Dataquery, description: str = "", stack: bool = False) -> Any:
    panel = timeseries.Panel().title(title).datasource(PROM).unit(unit).description(description)
    if stack:
        panel.stacking(_stacking()).fill_opacity(40)
    return _targets(panel, queries)


def _stacking() -> Any:
    from grafana_foundation_sdk.builders.common import StackingConfig

    return StackingConfig().mode(StackingMode.NORMAL)


def _stat(title: str, unit: str, query: prometheus.Dataquery, description: str = "") -> Any:
    return _targets(stat.Panel().title(title).datasource(PROM).unit(unit).description(description), [query])


def _bars(title: str, unit: str, query: prometheus.Dataquery, description: str = "") -> Any:
    panel = (
        bargauge.Panel()
        .title(title)
        .datasource(PROM)
        .unit(unit)
        .description(description)
        .orientation(VizOrientation.HORIZONTAL)
        .display_mode(BarGaugeDisplayMode.BASIC)
        .min(0)
    )
    return _targets(panel, [query])


def _traces(title: str, traceql: str, description: str) -> Any:
    query = tempo.TempoQuery().query_type("traceql").query(traceql).limit(20).datasource(TEMPO).ref_id("A")
    return table.Panel().title(title).datasource(TEMPO).description(description).with_target(query)


def _quantile(q: str, metric: str = "otelprof_step_duration_seconds", sel: str = SEL) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{sel}}}[{RATE}])))"


def training() -> dict[str, Any]:
    """Training overview: steps, throughput, phases, ranks, memory, windows, exporter."""
    board, lay = _board(
        "otelprof-training",
        "otelprof / Training overview",
        "Step time, throughput, phases, per-rank behaviour, memory, profiling windows and the "
        "exporter's health of otelprof-instrumented PyTorch jobs. Exemplars open step traces.",
    )
    lay.row("Steps")
    lay.add(
        _ts(
            "Step time",
            "s",
            _prom(_quantile("0.5"), "p50", exemplar=True),
            _prom(_quantile("0.9"), "p90"),
            _prom(_quantile("0.99"), "p99"),
            description="Quantiles over the selected ranks. Exemplar dots are steps; click one to open its trace.",
        ),
        12,
    )
    heat = (
        heatmap.Panel()
        .title("Step time distribution")
        .datasource(PROM)
        .description("Steps per duration bucket.")
        .calculate(False)
        .with_target(
            _prom(f"sum by (le) (increase(otelprof_step_duration_seconds_bucket{{{SEL}}}[{RATE}]))", "{{le}}")
            .format(PromQueryFormat.HEATMAP)
            .ref_id("A")
        )
    )
    lay.add(heat, 12)
    lay.add(
        _ts(
            "Steps per second",
            "ops",
            _prom(f"sum by (run) (rate(otelprof_steps_total{{{SEL}}}[{RATE}]))", "{{run}}"),
            description="Summed over the selected ranks (each rank counts its own steps).",
        ),
        8,
    )
    lay.add(
        _ts(
            "Throughput",
            "short",
            _prom(f"sum by (run) (rate(otelprof_samples_total{{{SEL}}}[{RATE}]))", "samples/s {{run}}"),
            _prom(f"sum by (run) (rate(otelprof_tokens_total{{{SEL}}}[{RATE}]))", "tokens/s {{run}}"),
            description="Samples and tokens per second, all selected ranks. Needs a batch size (inferred from "
            "the DataLoader's batch or otelprof.set_batch_size).",
        ),
        8,
    )
    lay.add(
        _stat(
            "Since the last step",
            "s",
            _prom(f"time() - max by (run) (otelprof_last_step_timestamp_seconds{{{SEL}}})", "{{run}}", instant=True),
            "Seconds since the most recent step of any selected rank ended (the stall alert watches this).",
        ),
        8,
    )
    lay.add(
        _ts(
            "Model FLOPs utilisation",
            "percentunit",
            _prom(f"max by (rank, device, source) (otelprof_mfu_ratio{{{SEL}}})", "rank {{rank}} {{source}}"),
            description="Achieved FLOP/s over the device's dense peak for the matmul dtype (the MFU-drop alert "
            "watches the estimated line). Needs windows with with_flops (OTELPROF_PROFILE_OPTIONS); on CPU, "
            "OTELPROF_PEAK_FLOPS. estimated: the last window's FLOPs per step over each step's time; window: the "
            "profiled steps themselves, slowed by the profiler.",
        ),
        12,
    )
    lay.add(
        _ts(
            "Achieved FLOP/s",
            "flops",
            _prom(
                f'max by (rank, device) (otelprof_achieved_flops_per_second{{{SEL}, source="estimated"}})',
                "rank {{rank}} device {{device}}",
            ),
            description="FLOPs per step (forward and backward, as torch's with_flops counts them) over step time.",
        ),
        12,
    )

    lay.row("Phases")
    lay.add(
        _ts(
            "Time per step by phase",
            "s",
            _prom(
                f"sum by (phase) (rate(otelprof_step_phase_duration_seconds_sum{{{SEL}}}[{RATE}]))"
                f" / on () group_left () sum(rate(otelprof_step_duration_seconds_count{{{SEL}}}[{RATE}]))",
                "{{phase}}",
            ),
            description="Mean seconds per step in each phase (data wait, forward, backward, optimizer).",
            stack=True,
        ),
        12,
    )
    lay.add(
        _bars(
            "Share of step time by phase",
            "percentunit",
            _prom(
                f"sum by (phase) (rate(otelprof_step_phase_duration_seconds_sum{{{SEL}}}[{RATE}]))"
                f" / on () group_left () sum(rate(otelprof_step_duration_seconds_sum{{{SEL}}}[{RATE}]))",
                "{{phase}}",
                instant=True,
            ),
            "A high data share means the job waits for its input (the input-bound alert watches it).",
        ),
        12,
    )

    lay.row("Ranks")
    lay.add(
        _ts(
            "Mean step time by rank",
            "s",
            _prom(
                f"sum by (rank) (rate(otelprof_step_duration_seconds_sum{{{SEL}}}[{RATE}]))"
                f" / sum by (rank) (rate(otelprof_step_duration_seconds_count{{{SEL}}}[{RATE}]))",
                "rank {{rank}}",
            ),
            description="One line per rank: a rank apart from the others is a straggler or a sick node.",
        ),
        12,
    )
    lay.add(
        _ts(
            "Straggler ratio",
            "x",
            _prom(f"max by (rank) (otelprof_straggler_ratio{{{SEL}}})", "rank {{rank}}"),
            description="A rank's recent mean step time over the group's median (1 typical). Distributed runs only.",
        ),
        12,
    )
    lay.add(
        _ts(
            "Process CPU",
            "short",
            _prom(f"sum by (rank) (rate(otelprof_process_cpu_seconds_total{{{SEL}}}[{RATE}]))", "rank {{rank}}"),
            description="CPU cores busy per rank process (user + system).",
        ),
        12,
    )
    lay.add(
        _ts(
            "Peak resident memory",
            "bytes",
            _prom(f"max by (rank) (otelprof_process_max_rss_bytes{{{SEL}}})", "rank {{rank}}"),
        ),
        12,
    )

    lay.row("GPU memory")
    lay.add(
        _ts(
            "GPU memory",
            "bytes",
            *(
                _prom(
                    f"max by (rank, device) (otelprof_gpu_memory_{kind}_bytes{{{SEL}}})",
                    f"{kind} r{{{{rank}}}} d{{{{device}}}}",
                )
                for kind in ("allocated", "reserved", "peak", "total")
            ),
            description="CUDA memory by rank and device: held by tensors, by the caching allocator, their peak, "
            "the capacity.",
        ),
        12,
    )
    lay.add(
        _bars(
            "GPU memory used",
            "percentunit",
            _prom(
                f"max by (rank, device) (otelprof_gpu_memory_reserved_bytes{{{SEL}}}"
                f" / otelprof_gpu_memory_total_bytes{{{SEL}}})",
                "rank {{rank}} device {{device}}",
                instant=True,
            ),
            "Reserved over capacity (the near-capacity alert watches it).",
        ),
        12,
    )

    lay.row("Profiling windows")
    lay.add(
        _ts(
            "Profiling windows",
            "short",
            _prom(f"sum by (trigger) (increase(otelprof_profiling_windows_total{{{SEL}}}[{RATE}]))", "{{trigger}}"),
            _prom(f"sum(increase(otelprof_profiling_windows_failed_total{{{SEL}}}[{RATE}]))", "failed"),
            description="Windows converted and exported, by what started them; failures.",
        ).draw_style(GraphDrawStyle.BARS),
        12,
    )
    lay.add(
        _stat(
            "Since the last window",
            "s",
            _prom(
                f"time() - max by (run) (otelprof_profiling_window_last_timestamp_seconds{{{SEL}}})",
                "{{run}}",
                instant=True,
            ),
        ),
        6,
    )
    lay.add(
        _stat(
            "Step spans dropped",
            "short",
            _prom(f"sum(otelprof_step_spans_dropped_total{{{SEL}}})", "dropped", instant=True),
            "Step spans the encoder could not keep up with (counted, never blocking the loop).",
        ),
        6,
    )
    lay.add(
        _traces(
            "Slowest recent steps",
            '{ name = "train.step" && resource.otelprof.run.id =~ "$run" && span.otelprof.step.number >= 0 }',
            "Step traces in Tempo for the selected runs; open one for its phases and, in profiled steps, operators "
            "and kernels.",
        ),
        24,
    )

    lay.row("Exporter")
    lay.add(
        _ts(
            "Export requests",
            "reqps",
            _prom(
                f"sum by (signal, result) (rate(otelprof_export_requests_total{{{EXPORT_SEL}}}[{RATE}]))",
                "{{signal}} {{result}}",
            ),
            _prom(f"sum(rate(otelprof_export_retries_total{{{EXPORT_SEL}}}[{RATE}]))", "retries"),
            description="What became of OTLP requests: exported, spooled to disk, replayed from it, dropped.",
        ),
        8,
    )
    lay.add(
        _ts(
            "Export latency",
            "s",
            _prom(_quantile("0.5", "otelprof_export_duration_seconds", EXPORT_SEL), "p50"),
            _prom(_quantile("0.99", "otelprof_export_duration_seconds", EXPORT_SEL), "p99"),
        ),
        8,
    )
    lay.add(
        _ts(
            "Queue and spool",
            "short",
            _prom(f"sum by (instance) (otelprof_export_queue_requests{{{EXPORT_SEL}}})", "queued {{instance}}"),
            _prom(f"sum by (instance) (otelprof_export_spool_bytes{{{EXPORT_SEL}}})", "spool bytes {{instance}}"),
            _prom(
                f"sum by (instance) (increase(otelprof_export_spans_rejected_total{{{EXPORT_SEL}}}[{RATE}]))",
                "rejected spans {{instance}}",
            ),
            _prom(
                f"sum by (instance) (increase(otelprof_export_spool_evicted_requests_total{{{EXPORT_SEL}}}[{RATE}]))",
                "evicted requests {{instance}}",
            ),
            description="Requests waiting in memory, bytes waiting on disk, and data lost.",
        ),
        8,
    )
    return _build(board)


def operators() -> dict[str, Any]:
    """Operators view: what the profiled windows found (ops, kernels, GPU busy share)."""
    board, lay = _board(
        "otelprof-operators",
        "otelprof / Operators",
        "The top operators and kernels of the latest profiling window of each rank, per profiled step, and how "
        "busy the GPU was. Values change when a new window is converted.",
    )
    lay.row("CPU")
    lay.add(
        _bars(
            "Top operators by self CPU time",
            "s",
            _prom(f"sort_desc(avg by (op) (otelprof_window_op_self_cpu_seconds{{{SEL}}}))", "{{op}}", instant=True),
            "Self CPU seconds per profiled step, averaged over the selected ranks' last windows.",
        ),
        12,
        10,
    )
    lay.add(
        _ts(
            "Self CPU time by operator",
            "s",
            _prom(f"avg by (op) (otelprof_window_op_self_cpu_seconds{{{SEL}}})", "{{op}}"),
            description="Per profiled step, window after window: a step in a line is a change between windows.",
            stack=True,
        ),
        12,
        10,
    )
    lay.add(
        _ts(
            "Profiled self CPU time by rank",
            "s",
            _prom(f"sum by (rank) (otelprof_window_op_self_cpu_seconds{{{SEL}}})", "rank {{rank}}"),
            description="All operators' self CPU time per profiled step, by rank.",
        ),
        24,
    )
    lay.row("GPU")
    lay.add(
        _bars(
            "Top operators by self device time",
            "s",
            _prom(f"sort_desc(avg by (op) (otelprof_window_op_self_device_seconds{{{SEL}}}))", "{{op}}", instant=True),
            "Device seconds per profiled step of the kernels each operator launched.",
        ),
        12,
        10,
    )
    lay.add(
        _bars(
            "Top kernels",
            "s",
            _prom(
                f"sort_desc(avg by (kernel) (otelprof_window_kernel_device_seconds{{{SEL}}}))",
                "{{kernel}}",
                instant=True,
            ),
            "Device seconds per profiled step by kernel (memcpy and memset included).",
        ),
        12,
        10,
    )
    lay.add(
        _ts(
            "GPU busy",
            "percentunit",
            _prom(f"avg by (rank) (otelprof_window_gpu_busy_ratio{{{SEL}}})", "rank {{rank}}"),
            description="Share of the profiled steps' wall time with a kernel running. Low: the GPU waits for the "
            "CPU, the input or communication.",
        ).max(1),
        12,
    )
    lay.add(
        _ts(
            "Self device time by operator",
            "s",
            _prom(f"avg by (op) (otelprof_window_op_self_device_seconds{{{SEL}}})", "{{op}}"),
            stack=True,
        ),
        12,
    )
    lay.row("Windows")
    lay.add(
        _stat(
            "Windows",
            "short",
            _prom(f"sum(otelprof_profiling_windows_total{{{SEL}}})", "windows", instant=True),
            "Profiling windows converted so far by the selected ranks.",
        ),
        6,
    )
    lay.add(
        _stat(
            "Since the last window",
            "s",
            _prom(f"time() - max(otelprof_profiling_window_last_timestamp_seconds{{{SEL}}})", "age", instant=True),
        ),
        6,
    )
    lay.add(
        _traces(
            "Profiled steps",
            '{ name =~ "ProfilerStep#.*" && resource.otelprof.run.id =~ "$run" }',
            "Traces of profiled steps in Tempo: operators nested per thread, kernels under their launches.",
        ),
        12,
    )
    return _build(board)


def _build(board: dashboard.Dashboard) -> dict[str, Any]:
    encoded: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return encoded


DASHBOARDS = {"otelprof-training.json": training, "otelprof-operators.json": operators}


def render(model: dict[str, Any]) -> str:
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, make in DASHBOARDS.items():
        path = HERE / name
        text = render(make())
        if check:
            if not path.exists() or path.read_text("utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, "utf-8")
    if stale:
        print(f"out of date (run python dashboards/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
