//! A serving run, point by point: every [`PointKey`] of a [`ServePlan`] served on a fresh
//! [`Backend`] over the same seeded requests, each request and each finished point handed to a
//! [`ServeSink`] as it happens (the run folder's writer; `crate::report::serve`), so an
//! interrupted run keeps everything that finished. The scheduler is [`super::engine::serve`];
//! this loop adds what a point needs around it — the block sizer, the predicted concurrency,
//! other processes' CPU use — in the way hyperfine's scheduler runs benchmarks and hands
//! results to exporters.

use crate::error::Result;
use crate::kv::{CacheGeometry, KvScheme};
use crate::measure::contention::{Contention, CpuSample};
use crate::measure::sweep::Progress;
use crate::model::geometry::ModelGeometry;
use crate::perf::SpeedProbe;

use super::engine::{serve, Backend, RequestRecord, SchedConfig, ServeOutcome};
use super::settings::{PointKey, ServePlan};
use super::workload::{self, LenDist, Request};

/// The requests every point serves, built once: the same seeded prompts and lengths for every
/// scheme and load, so schemes are compared on identical work.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The requests, in arrival order.
    pub requests: Vec<Request>,
    /// The shared prefix's tokens (empty without `--shared-prefix`).
    pub prefix: Vec<u32>,
    /// Mean request length, prefix + prompt + output, tokens: what `kvbench plan` is asked
    /// about for the predicted concurrency.
    pub mean_ctx: usize,
}

impl Workload {
    /// The run's requests: prompts cut from `text` (the tokenized WikiText-2 test set) after
    /// its first `--shared-prefix` tokens, which are the prefix; `xsum_lengths(lens)` measures
    /// the XSum pairs' (article, summary) token lengths, called only when a length follows the
    /// XSum trace. Errors: `xsum_lengths`'s; [`workload::requests`]'s (text too short).
    pub fn build(
        plan: &ServePlan,
        text: &[u32],
        xsum_lengths: impl FnOnce() -> Result<(Vec<usize>, Vec<usize>)>,
    ) -> Result<Workload> {
        let l = &plan.settings.load;
        let trace =
            matches!(l.input_len, LenDist::Xsum(..)) || matches!(l.output_len, LenDist::Xsum(..));
        let (trace_in, trace_out) = if trace {
            xsum_lengths()?
        } else {
            (Vec::new(), Vec::new())
        };
        let requests = workload::requests(
            l.num_requests,
            &l.input_len,
            &l.output_len,
            text,
            l.shared_prefix,
            (&trace_in, &trace_out),
            plan.settings.seed.seed,
        )?;
        let mean = l.input_len.mean(&trace_in) + l.output_len.mean(&trace_out);
        Ok(Workload {
            requests,
            prefix: text[..l.shared_prefix.min(text.len())].to_vec(),
            mean_ctx: l.shared_prefix + mean.round() as usize,
        })
    }
}

/// One finished point, as the sink receives it.
#[derive(Debug)]
pub struct PointResult<'a> {
    /// Which point.
    pub key: &'a PointKey,
    /// Every request's record and the scheduler's trace, or why the point failed.
    pub outcome: std::result::Result<ServeOutcome, String>,
    /// Bytes per block of this scheme.
    pub block_bytes: u64,
    /// `kvbench plan`'s max concurrency at this budget for a request of the mean length.
    pub predicted_max_concurrency: u64,
    /// Other processes' CPU use while the point ran (`None`: cannot tell).
    pub contention: Option<Contention>,
    /// The speed probe of the point ([`PointBackend::probe`]).
    pub probe: Option<SpeedProbe>,
}

/// A point's backend, as the run's backend maker hands it over.
pub struct PointBackend<'m> {
    /// The backend the point is served on.
    pub backend: Box<dyn Backend + 'm>,
    /// The speed probe ([`SpeedProbe`]) that goes with it: a measured point's, taken right
    /// before its backend was made; a simulated point's under `--speed-from`, the measured
    /// run's (its median) its costs were scaled to; otherwise none.
    pub probe: Option<SpeedProbe>,
}

/// Where a serving run's results go as they happen (the run folder's raw log).
pub trait ServeSink {
    /// A request of point `key` finished.
    fn request(&mut self, key: &PointKey, record: &RequestRecord) -> Result<()>;
    /// A point finished (or failed).
    fn point(&mut self, result: PointResult<'_>) -> Result<()>;
}

/// The model a serving run describes to `kvbench plan`: geometry and context, no weights (the
/// budget is all KV, so the MLP width and the vocabulary, which only size the engine's
/// activation reserve, are left at 0).
pub fn plan_geometry(name: &str, geom: CacheGeometry, max_ctx: usize) -> ModelGeometry {
    ModelGeometry {
        name: name.to_string(),
        layers: geom.layers,
        q_heads: geom.q_heads,
        kv_heads: geom.kv_heads,
        head_dim: geom.head_dim,
        hidden: geom.q_heads * geom.head_dim,
        intermediate: 0,
        vocab: 0,
        max_ctx,
        params: 0,
        window: geom.window,
        weight_dtype: "gguf".into(),
        source: "loaded model".into(),
    }
}

/// `kvbench plan`'s max concurrency for `scheme` at the plan's budget (no reserve, no
/// weights) for sequences of `mean_ctx` tokens. Errors: the planner's.
pub fn predicted_concurrency(
    plan: &ServePlan,
    model: &ModelGeometry,
    scheme: KvScheme,
    mean_ctx: usize,
) -> Result<u64> {
    let input = crate::plan::PlanInput {
        model: model.clone(),
        memory_bytes: plan.budget,
        reserve: 0.0,
        weight_bytes: 0,
        block: plan.settings.pool.block_size,
        tensor_parallel: plan.settings.sim.tensor_parallel,
    };
    Ok(crate::plan::plan(&input, &[scheme], &[mean_ctx])?[0].max_concurrency)
}

/// Serves every point of `todo` (a subset of `plan.points()`, in order) over `work` on a
/// backend `backend(scheme)` makes fresh for each point; each finished request and point goes
/// to `sink`, one progress unit per request. A point whose scheduler or backend fails is
/// handed to the sink as failed and the run goes on, as is one whose backend cannot be made.
/// Errors: the sink's; a scheme name that does not parse.
pub fn run<'m>(
    plan: &ServePlan,
    model: &ModelGeometry,
    work: &Workload,
    todo: &[PointKey],
    backend: &mut dyn FnMut(KvScheme) -> Result<PointBackend<'m>>,
    sink: &mut dyn ServeSink,
    progress: &dyn Progress,
) -> Result<()> {
    let geom = plan.pool_geometry(model.cache());
    for key in todo {
        let scheme: KvScheme = key.scheme.parse()?;
        progress.start(&format!("{} · {}", key.scheme, key.arrival.label()));
        let sched = SchedConfig {
            sizer: plan.sizer(scheme, geom),
            kv_budget: plan.budget,
            max_num_seqs: plan.settings.pool.max_num_seqs,
            prefix_tokens: plan.settings.load.shared_prefix,
            prefix_caching: key.prefix_caching,
        };
        let predicted = predicted_concurrency(plan, model, scheme, work.mean_ctx)?;
        // A backend that cannot be made (its warm-up request failed: NaN logits from damaged
        // weights, say) fails its point; the run goes on.
        let PointBackend {
            backend: mut b,
            probe,
        } = match backend(scheme) {
            Ok(b) => b,
            Err(e) => {
                sink.point(PointResult {
                    key,
                    outcome: Err(e.to_string()),
                    block_bytes: sched.sizer.block_bytes(),
                    predicted_max_concurrency: predicted,
                    contention: None,
                    probe: None,
                })?;
                continue;
            }
        };
        let before = CpuSample::now();
        let outcome = serve(
            b.as_mut(),
            &sched,
            &work.requests,
            key.arrival,
            &work.prefix,
            plan.settings.seed.seed,
            &mut |r| {
                progress.advance(1);
                sink.request(key, r)
            },
        );
        let contention = before
            .zip(CpuSample::now())
            .and_then(|(x, y)| Contention::between(&x, &y));
        drop(b);
        sink.point(PointResult {
            key,
            outcome: outcome.map_err(|e| e.to_string()),
            block_bytes: sched.sizer.block_bytes(),
            predicted_max_concurrency: predicted,
            contention,
            probe,
        })?;
    }
    Ok(())
}
