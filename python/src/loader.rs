//! `shardify._native.Loader`: the Rust loader behind `shardify.Loader`, one epoch (one
//! Rust [`Loader`]) at a time, with the position the Python object saves and restores.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use shardify::batch::{sections, BatchLayout};
use shardify::dataset::View;
use shardify::device::staging::StagingPool;
use shardify::device::{DeviceChoice, Placement};
use shardify::pipeline::{
    check_staging_fits, rank_batch_count, Arrival, Batch, Loader, LoaderConfig, WorkerScheduling,
};
use shardify::resident::plan_epoch;
use shardify::sampler::{
    BatchOrder, Batching, EventLength, LengthGrouping, SamplerConfig, SamplerState,
};
use shardify::Error;

use crate::array::{numpy_name, PyHostArray};
use crate::batch::{capsules, exchanged, Delivered, PySection, SharedBatch};
use crate::dataset::PyDataset;
use crate::errors::{forked, to_py};
use crate::exchange::TensorExchange;
use crate::process::ProcessBound;

/// How long `next_batch` waits with the GIL released before it checks for signals
/// (Ctrl-C): short enough to feel prompt, long enough to cost nothing.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Where the Python loader stands, and the epoch running (if any).
struct Progress {
    placement: Placement,
    /// After the last batch handed out.
    position: SamplerState,
    /// The running epoch; `None` before the first batch and after a seek.
    running: Option<Loader>,
    /// The staging buffers, kept from epoch to epoch and across seeks.
    pool: Option<Arc<StagingPool>>,
    /// The running epoch ended (or failed): the next batch starts a new one.
    exhausted: bool,
}

/// The native loader; `shardify.Loader` (Python) wraps it.
#[pyclass(name = "Loader", module = "shardify._native", frozen)]
pub struct PyLoader {
    /// The dataset, or the part of its events (a split) the loader reads.
    view: View,
    config: LoaderConfig,
    /// Whether to hand out the label sections (only when the dataset has labels).
    labels: bool,
    progress: Mutex<ProcessBound<Progress>>,
    /// The handed-out sections' names as Python strings, in buffer order: the keys of
    /// every batch dict, made once.
    keys: Vec<(&'static str, Py<PyString>)>,
    /// The tensor type batches were first asked in (compared by identity), with its
    /// DLPack C exchange if it has one.
    exchange: OnceLock<(Py<PyAny>, Option<TensorExchange>)>,
}

/// `batch_events`, a pulse budget (`max_pulses`, optionally with `pulse_cap`) or a token
/// budget (`max_tokens`, optionally with `pad_to_multiple_of`), the budgets optionally with
/// `max_events`.
fn batching(
    batch_events: usize,
    max_pulses: Option<usize>,
    max_tokens: Option<usize>,
    max_events: Option<usize>,
    pulse_cap: Option<usize>,
    pad_to_multiple_of: Option<usize>,
) -> Result<Batching, Error> {
    if pulse_cap.is_some() && max_pulses.is_none() {
        return Err(Error::config(
            "pulse_cap",
            "applies with max_pulses only (each event counts at most pulse_cap of its pulses \
             toward the budget)",
        ));
    }
    if pad_to_multiple_of.is_some() && max_tokens.is_none() {
        return Err(Error::config(
            "pad_to_multiple_of",
            "applies with max_tokens only (the budget counts each batch's longest length \
             rounded up to it)",
        ));
    }
    match (max_pulses, max_tokens, max_events) {
        (Some(_), Some(_), _) => Err(Error::config(
            "max_tokens",
            "give max_pulses (a budget of pulses) or max_tokens (of padded tokens), not both",
        )),
        (Some(max_pulses), None, max_events) => Ok(Batching::Pulses {
            max_pulses,
            max_events,
            pulse_cap,
        }),
        (None, Some(max_tokens), max_events) => Ok(Batching::Tokens {
            max_tokens,
            max_events,
            pad_to_multiple_of,
        }),
        (None, None, Some(_)) => Err(Error::config(
            "max_events",
            "applies with max_pulses or max_tokens only (batch_events fixes the event count \
             otherwise)",
        )),
        (None, None, None) => Ok(Batching::Events(batch_events)),
    }
}

/// `"packed"`, or `"padded"` with `max_doms` and `pulses_per_dom`.
fn layout(
    name: &str,
    max_doms: Option<usize>,
    pulses_per_dom: Option<usize>,
) -> Result<BatchLayout, Error> {
    match (name, max_doms, pulses_per_dom) {
        ("packed", None, None) => Ok(BatchLayout::Packed),
        ("packed", _, _) => Err(Error::config(
            "max_doms",
            "max_doms and pulses_per_dom apply to layout=\"padded\" only",
        )),
        ("padded", Some(max_doms), Some(pulses_per_dom)) => Ok(BatchLayout::Padded {
            max_doms,
            pulses_per_dom,
        }),
        ("padded", _, _) => Err(Error::config(
            "layout",
            "\"padded\" needs max_doms and pulses_per_dom",
        )),
        (other, _, _) => Err(Error::config(
            "layout",
            format!("`{other}`: expected \"packed\" or \"padded\""),
        )),
    }
}

/// The settings that decide the order, as the Python state dict spells them.
fn order_settings(s: &SamplerConfig) -> serde_json::Value {
    let (batch_events, max_pulses, max_tokens, max_events, pulse_cap, multiple) = match s.batching {
        Batching::Events(n) => (Some(n), None, None, None, None, None),
        Batching::Pulses {
            max_pulses,
            max_events,
            pulse_cap,
        } => (None, Some(max_pulses), None, max_events, pulse_cap, None),
        Batching::Tokens {
            max_tokens,
            max_events,
            pad_to_multiple_of,
        } => (
            None,
            None,
            Some(max_tokens),
            max_events,
            None,
            pad_to_multiple_of,
        ),
    };
    let grouping = s.group_by_length.length_and_cap();
    serde_json::json!({
        "seed": s.seed,
        "block_events": s.block_events,
        "window_blocks": s.window_blocks,
        "run_events": s.run_events,
        "batch_events": batch_events,
        "max_pulses": max_pulses,
        "max_tokens": max_tokens,
        "max_events": max_events,
        "pulse_cap": pulse_cap,
        "pad_to_multiple_of": multiple,
        "batch_order": s.batch_order.to_string(),
        "shuffle": s.shuffle,
        "group_by_length": match grouping {
            None => serde_json::json!(false),
            Some((_, None)) => serde_json::json!(true),
            Some((_, Some(cap))) => serde_json::json!(cap),
        },
        "length_of": grouping.map_or(EventLength::Pulses, |(length, _)| length).to_string(),
    })
}

/// `group_by_length` and `length_of` as the Python loader passes them on: whether, the
/// cap, and what lengths count.
fn length_grouping(
    group: bool,
    cap: Option<usize>,
    length_of: &str,
) -> Result<LengthGrouping, Error> {
    let length = length_of
        .parse::<EventLength>()
        .map_err(|problem| Error::config("length_of", problem))?;
    Ok(match group {
        false => LengthGrouping::Off,
        true => LengthGrouping::of(length, cap),
    })
}

/// The settings a state saved as [`order_settings`] JSON was made with, as a sampler (rank,
/// world and drop_last taken from `ours`; `shuffle` true and `group_by_length` off in a state
/// from before they existed).
fn saved_sampler(json: &str, ours: &SamplerConfig) -> Result<SamplerConfig, Error> {
    #[derive(serde::Deserialize)]
    struct Saved {
        seed: u64,
        block_events: usize,
        window_blocks: usize,
        run_events: usize,
        batch_events: Option<usize>,
        max_pulses: Option<usize>,
        /// Absent from a state from before it existed.
        #[serde(default)]
        max_tokens: Option<usize>,
        max_events: Option<usize>,
        /// Absent from a state from before it existed.
        #[serde(default)]
        pulse_cap: Option<usize>,
        /// Absent from a state from before it existed.
        #[serde(default)]
        pad_to_multiple_of: Option<usize>,
        batch_order: String,
        shuffle: Option<bool>,
        /// false, true (no cap) or the cap.
        #[serde(default)]
        group_by_length: Option<serde_json::Value>,
        /// What the grouping counts (pulses in a state from before it existed).
        #[serde(default)]
        length_of: Option<String>,
    }
    let saved: Saved = serde_json::from_str(json)
        .map_err(|e| Error::config("state", format!("the saved sampler settings: {e}")))?;
    Ok(SamplerConfig {
        seed: saved.seed,
        block_events: saved.block_events,
        window_blocks: saved.window_blocks,
        run_events: saved.run_events,
        batching: batching(
            saved.batch_events.unwrap_or(0),
            saved.max_pulses,
            saved.max_tokens,
            saved.max_events,
            saved.pulse_cap,
            saved.pad_to_multiple_of,
        )?,
        batch_order: batch_order(&saved.batch_order)?,
        shuffle: saved.shuffle.unwrap_or(true),
        group_by_length: {
            let (group, cap) = match saved.group_by_length {
                None | Some(serde_json::Value::Bool(false)) => (false, None),
                Some(serde_json::Value::Bool(true)) => (true, None),
                Some(serde_json::Value::Number(cap)) => {
                    let cap = cap.as_u64().and_then(|c| usize::try_from(c).ok());
                    let cap = cap.ok_or_else(|| {
                        Error::config("state", format!("the saved group_by_length {cap:?}"))
                    })?;
                    (true, Some(cap))
                }
                Some(other) => {
                    return Err(Error::config(
                        "state",
                        format!("the saved group_by_length {other}: expected false, true or a cap"),
                    ))
                }
            };
            length_grouping(group, cap, saved.length_of.as_deref().unwrap_or("pulses"))?
        },
        ..ours.clone()
    })
}

fn batch_order(name: &str) -> Result<BatchOrder, Error> {
    name.parse()
        .map_err(|problem: String| Error::config("batch_order", problem))
}

/// What a loader used from a second thread while one is inside it says (the streaming
/// loader here, the resident loader's Python side through the module's constant).
pub(crate) const ONE_THREAD_AT_A_TIME: &str =
    "another thread is using this shardify loader: iterate a loader from one thread at a time";

impl PyLoader {
    /// The progress, unless another thread is inside `next_batch` (waiting for it while
    /// holding the GIL would deadlock that thread) or this is a forked child.
    fn progress(&self) -> PyResult<MutexGuard<'_, ProcessBound<Progress>>> {
        match self.progress.try_lock() {
            Ok(guard) => Ok(guard),
            Err(TryLockError::Poisoned(poisoned)) => Ok(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => Err(PyRuntimeError::new_err(ONE_THREAD_AT_A_TIME)),
        }
    }

    /// The next batch of the running epoch (started at the position when none runs),
    /// waiting with the GIL released; `None` at the epoch's end.
    fn next_delivered(&self, py: Python<'_>, progress: &mut Progress) -> PyResult<Option<Batch>> {
        let stale = progress.exhausted
            || progress
                .running
                .as_ref()
                .is_some_and(|l| l.current_position() != progress.position);
        if stale || progress.running.is_none() {
            progress.running = None; // stops and joins the old epoch's threads first
            let (view, config) = (self.view.clone(), self.config.clone());
            let (position, placement) = (progress.position, progress.placement.clone());
            let pool = progress.pool.clone();
            let loader = py
                .detach(|| Loader::on_pool(view, config, position, placement, pool))
                .map_err(to_py)?;
            progress.pool = Some(loader.staging_pool().clone());
            progress.running = Some(loader);
            progress.exhausted = false;
        }
        let loader = progress.running.as_mut().expect("started above");
        let arrival = loop {
            match py.detach(|| loader.next_within(SIGNAL_POLL)) {
                Arrival::NotYet => py.check_signals()?,
                arrival => break arrival,
            }
        };
        progress.position = loader.current_position();
        match arrival {
            Arrival::Ready(Ok(batch)) => Ok(Some(batch)),
            Arrival::Ready(Err(e)) => {
                progress.exhausted = true;
                Err(to_py(e))
            }
            Arrival::Finished | Arrival::NotYet => {
                progress.exhausted = true;
                Ok(None)
            }
        }
    }

    /// The next batch, shared by whatever will view it, or `None` at the epoch's end.
    fn next_shared(&self, py: Python<'_>) -> PyResult<Option<SharedBatch>> {
        let next = {
            let mut guard = self.progress()?;
            let progress = guard.get_mut().map_err(forked)?;
            let ordinal = progress.placement.cuda().map(|d| d.ordinal());
            self.next_delivered(py, progress).map(|batch| {
                batch.map(|batch| Arc::new(ProcessBound::new(Delivered::new(batch, ordinal))))
            })
        };
        // With the loader's lock released: a logging handler may call back into it.
        crate::log::relay(py)?;
        next
    }

    /// The sections a batch hands out, in buffer order.
    fn hands_out(&self, name: &str) -> bool {
        hands_out(self.labels, name)
    }

    /// The DLPack C exchange of `tensor_type`, looked up once: the first type asked for
    /// is remembered (a loader hands out one library's tensors), any other looked up anew.
    fn exchange_of(&self, tensor_type: &Bound<'_, PyAny>) -> PyResult<Option<TensorExchange>> {
        if let Some((known, exchange)) = self.exchange.get() {
            if known.is(tensor_type) {
                return Ok(*exchange);
            }
        }
        let exchange = TensorExchange::of(tensor_type)?;
        let _ = self.exchange.set((tensor_type.clone().unbind(), exchange));
        Ok(exchange)
    }
}

/// Whether a batch hands out section `name`: the labels only when the dataset has them.
fn hands_out(labels: bool, name: &str) -> bool {
    labels || (name != sections::EVENT_AZIMUTH && name != sections::EVENT_ZENITH)
}

/// The sections a batch of `config` over `view` hands out, in buffer order: (name, numpy
/// dtype name).
fn handed_out(view: &View, config: &LoaderConfig) -> Vec<(&'static str, &'static str)> {
    let types = &view.dataset().manifest().schema.types;
    let shape = shardify::batch::BatchShape::default();
    shardify::batch::plan_sections(config.layout, shape, types, config.dom_positions)
        .list
        .into_iter()
        .filter(|s| hands_out(types.labels, s.name))
        .map(|s| (s.name, numpy_name(s.dtype)))
        .collect()
}

#[pymethods]
impl PyLoader {
    /// Every argument explicit: `shardify.Loader` (Python) resolves the defaults.
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (dataset, *, batch_events, max_pulses, max_tokens, max_events, pulse_cap,
        pad_to_multiple_of, layout, max_doms,
        pulses_per_dom, seed, block_events, window_blocks, run_events, batch_order, shuffle,
        group_by_length, length_cap, length_of, drop_last, rank, world, workers,
        worker_scheduling, consumer_gathers, prefetch, device, dom_positions))]
    fn new(
        py: Python<'_>,
        dataset: &PyDataset,
        batch_events: usize,
        max_pulses: Option<usize>,
        max_tokens: Option<usize>,
        max_events: Option<usize>,
        pulse_cap: Option<usize>,
        pad_to_multiple_of: Option<usize>,
        layout: &str,
        max_doms: Option<usize>,
        pulses_per_dom: Option<usize>,
        seed: u64,
        block_events: usize,
        window_blocks: usize,
        run_events: usize,
        batch_order: &str,
        shuffle: bool,
        group_by_length: bool,
        length_cap: Option<usize>,
        length_of: &str,
        drop_last: bool,
        rank: usize,
        world: usize,
        workers: usize,
        worker_scheduling: &str,
        consumer_gathers: bool,
        prefetch: Option<usize>,
        device: &str,
        dom_positions: bool,
    ) -> PyResult<Self> {
        let config = LoaderConfig {
            sampler: SamplerConfig {
                seed,
                block_events,
                window_blocks,
                run_events,
                batching: batching(
                    batch_events,
                    max_pulses,
                    max_tokens,
                    max_events,
                    pulse_cap,
                    pad_to_multiple_of,
                )
                .map_err(to_py)?,
                batch_order: self::batch_order(batch_order).map_err(to_py)?,
                shuffle,
                group_by_length: length_grouping(group_by_length, length_cap, length_of)
                    .map_err(to_py)?,
                drop_last,
                rank,
                world,
            },
            layout: self::layout(layout, max_doms, pulses_per_dom).map_err(to_py)?,
            workers,
            worker_scheduling: worker_scheduling
                .parse::<WorkerScheduling>()
                .map_err(to_py)?,
            consumer_gathers,
            prefetch,
            device: device.parse::<DeviceChoice>().map_err(to_py)?,
            dom_positions,
            ..LoaderConfig::default()
        };
        config.validate().map_err(to_py)?;
        let choice = config.device;
        let placement = crate::log::detached(py, || Placement::resolve(choice))?.map_err(to_py)?;
        check_staging_fits(&dataset.view, &config, &placement).map_err(to_py)?;
        let keys = handed_out(&dataset.view, &config)
            .into_iter()
            .map(|(name, _)| (name, PyString::intern(py, name).unbind()))
            .collect();
        Ok(PyLoader {
            labels: dataset.view.dataset().manifest().schema.types.labels,
            view: dataset.view.clone(),
            keys,
            exchange: OnceLock::new(),
            config,
            progress: Mutex::new(ProcessBound::new(Progress {
                placement,
                position: SamplerState::start(0),
                running: None,
                pool: None,
                exhausted: false,
            })),
        })
    }

    /// The next batch's sections (in buffer order, labels left out on an unlabelled
    /// dataset), or `None` at the end of the epoch; the GIL is released while waiting, and
    /// Ctrl-C raises `KeyboardInterrupt` within a fraction of a second.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<Vec<PySection>>> {
        let Some(shared) = self.next_shared(py)? else {
            return Ok(None);
        };
        let list = shared.get().map_err(forked)?.sections();
        Ok(Some(
            list.into_iter()
                .filter(|s| self.hands_out(s.name))
                .map(|s| PySection::new(shared.clone(), s))
                .collect(),
        ))
    }

    /// The next batch as legacy DLPack capsules, one per section (in `sections()` order),
    /// or `None` at the end of the epoch; on CUDA, `stream` (the consumer's current stream,
    /// as DLPack passes it) waits for the batch's copy. The package's own side of a torch
    /// batch, which the Python benchmark times without torch.
    #[pyo3(signature = (stream = None))]
    fn next_batch_capsules(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Option<Vec<Py<PyAny>>>> {
        let Some(shared) = self.next_shared(py)? else {
            return Ok(None);
        };
        let hands_out = |name: &str| self.hands_out(name);
        let capsules = capsules(py, &shared, hands_out, stream.as_ref())?;
        Ok(Some(capsules.into_iter().map(|(_, c)| c).collect()))
    }

    /// The next batch as a dict `{name: tensor}` over its sections (in `sections()`
    /// order), or `None` at the end of the epoch; on CUDA, `stream` waits for the batch's
    /// copy as in `next_batch_capsules`. Each tensor is made by the DLPack C exchange API of
    /// `tensor_type` (`torch.Tensor` has one in recent torch: one C call a section) when it
    /// has one, else by `convert` on the section's legacy DLPack capsule (torch's capsule
    /// import). What `shardify.Loader` yields: one native call per batch, the dict built
    /// here with keys made once (in Python, `dict(zip(names, map(convert, capsules)))` costs
    /// 0.5 µs a batch more).
    #[pyo3(signature = (convert, stream = None, tensor_type = None))]
    fn next_batch_dict<'py>(
        &self,
        py: Python<'py>,
        convert: &Bound<'py, PyAny>,
        stream: Option<Bound<'py, PyAny>>,
        tensor_type: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let exchange = match &tensor_type {
            Some(tensor_type) => self.exchange_of(tensor_type)?,
            None => None,
        };
        let Some(shared) = self.next_shared(py)? else {
            return Ok(None);
        };
        let hands_out = |name: &str| self.hands_out(name);
        let batch = PyDict::new(py);
        let insert =
            |index: usize, name: &str, tensor: Bound<'py, PyAny>| match self.keys.get(index) {
                Some((known, key)) if *known == name => batch.set_item(key.bind(py), tensor),
                // Not reached (a batch's sections follow `sections()`), but a new layout that
                // broke this would still give right keys.
                _ => batch.set_item(name, tensor),
            };
        if let Some(exchange) = exchange {
            let tensors = exchanged(py, &shared, hands_out, stream.as_ref(), exchange)?;
            for (index, (name, tensor)) in tensors.into_iter().enumerate() {
                insert(index, name, tensor)?;
            }
        } else {
            let capsules = capsules(py, &shared, hands_out, stream.as_ref())?;
            for (index, (name, capsule)) in capsules.into_iter().enumerate() {
                insert(index, name, convert.call1((capsule,))?)?;
            }
        }
        Ok(Some(batch))
    }

    /// Takes the rest of the epoch in Rust, dropping each batch as it comes: the same
    /// loader with no Python per batch, the baseline of the Python benchmark. Returns
    /// (batches, events, pulses, seconds).
    fn drain(&self, py: Python<'_>) -> PyResult<(u64, u64, u64, f64)> {
        let mut guard = self.progress()?;
        let progress = guard.get_mut().map_err(forked)?;
        let started = std::time::Instant::now();
        let (mut batches, mut events, mut pulses) = (0, 0, 0);
        let drained = loop {
            match self.next_delivered(py, progress) {
                Ok(Some(batch)) => {
                    batches += 1;
                    events += batch.shape().events as u64;
                    pulses += batch.shape().pulses as u64;
                }
                Ok(None) => break Ok((batches, events, pulses, started.elapsed().as_secs_f64())),
                Err(e) => break Err(e),
            }
        };
        drop(guard);
        crate::log::relay(py)?;
        drained
    }

    /// (epoch, origin, batches handed out since): where the next batch comes from (see
    /// `SamplerState`: this rank takes the global batches `origin + rank + k * world`).
    fn position(&self) -> PyResult<(u64, u64, u64)> {
        let guard = self.progress()?;
        let progress = guard.get().map_err(forked)?;
        let p = progress.position;
        Ok((p.epoch, p.origin, p.batches_taken))
    }

    /// Moves to batch `batches_taken` of `epoch` counted from global batch `origin`; the
    /// running epoch (if any) stops.
    fn seek(&self, epoch: u64, origin: u64, batches_taken: u64) -> PyResult<()> {
        let mut guard = self.progress()?;
        let progress = guard.get_mut().map_err(forked)?;
        progress.position = SamplerState {
            epoch,
            batches_taken,
            origin,
        };
        progress.running = None;
        progress.exhausted = false;
        Ok(())
    }

    /// The exact number of batches this rank gets in `epoch`, dealt from global batch
    /// `origin` on.
    fn batch_count(&self, py: Python<'_>, epoch: u64, origin: u64) -> PyResult<u64> {
        let (view, sampler) = (&self.view, &self.config.sampler);
        py.detach(|| rank_batch_count(view, sampler, epoch, origin))
            .map_err(to_py)
    }

    /// The settings that decide the order (what a saved state must match; rank, world and
    /// drop_last left out: a state resumes any rank of any world size), as JSON text.
    fn settings_json(&self) -> String {
        order_settings(&self.config.sampler).to_string()
    }

    /// Refuses, with a `ValueError` naming the field, a state saved with `settings_json`
    /// (JSON text, as `settings_json` wrote it) that decides another order.
    fn check_resumable(&self, settings_json: &str) -> PyResult<()> {
        let saved = saved_sampler(settings_json, &self.config.sampler).map_err(to_py)?;
        self.config.sampler.check_resumable(&saved).map_err(to_py)
    }

    /// Which events the loader reads ([`shardify::dataset::View::identity`]): what a saved
    /// position refers to.
    fn dataset_identity(&self) -> String {
        self.view.identity()
    }

    /// Refuses, with a `ValueError` naming `dataset`, a state saved reading other events
    /// (`saved`, its `dataset_identity`).
    fn check_dataset(&self, saved: &str) -> PyResult<()> {
        self.view.check_identity(saved).map_err(to_py)
    }

    /// Staging buffers allocated since the first batch, over every epoch and seek
    /// (constant in the steady state; 0 before the first batch).
    fn staging_allocations(&self) -> PyResult<u64> {
        let guard = self.progress()?;
        let progress = guard.get().map_err(forked)?;
        Ok(progress.pool.as_ref().map_or(0, |pool| pool.allocations()))
    }

    /// Where batches go: "cpu" or "cuda:N", and on the CPU why (e.g. no driver).
    fn placement(&self) -> PyResult<(String, String)> {
        let guard = self.progress()?;
        let progress = guard.get().map_err(forked)?;
        Ok(match &progress.placement {
            Placement::Cpu { reason } => ("cpu".to_string(), reason.clone()),
            Placement::Cuda(device) => (format!("cuda:{}", device.ordinal()), String::new()),
        })
    }

    /// The sections a batch hands out, in order: (name, numpy dtype name).
    fn sections(&self) -> Vec<(&'static str, &'static str)> {
        handed_out(&self.view, &self.config)
    }

    /// This rank's batches of `epoch` (dealt from global batch `origin` on) after the first
    /// `batches_taken`, for a resident
    /// loader: (events, starts, doms, pulses, max_doms), int64 host arrays. `events` holds
    /// each event's global position (shards concatenated in manifest order) in delivery
    /// order; batch `b` holds `events[starts[b]:starts[b + 1]]`, with `doms[b]` DOMs,
    /// `pulses[b]` pulses, and `max_doms[b]` DOMs in its widest event: the batches, and
    /// the order, the streaming loader delivers with the same settings.
    fn epoch_plan(
        &self,
        py: Python<'_>,
        epoch: u64,
        origin: u64,
        batches_taken: u64,
    ) -> PyResult<(
        PyHostArray,
        PyHostArray,
        PyHostArray,
        PyHostArray,
        PyHostArray,
    )> {
        let position = SamplerState {
            epoch,
            batches_taken,
            origin,
        };
        let (view, sampler, layout) = (&self.view, &self.config.sampler, self.config.layout);
        let plan = py
            .detach(|| {
                let plan = plan_epoch(view, sampler, position)?;
                plan.check_fits(layout)?;
                Ok::<_, shardify::Error>(plan)
            })
            .map_err(to_py)?;
        Ok((
            PyHostArray::owned(plan.events),
            PyHostArray::owned(plan.starts),
            PyHostArray::owned(plan.doms),
            PyHostArray::owned(plan.pulses),
            PyHostArray::owned(plan.max_doms),
        ))
    }
}
