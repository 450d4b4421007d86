//! The optional OpenTelemetry metrics export: when `PLEXSPHERE_OTLP_ENDPOINT` names a
//! collector, the reference's two instruments are pushed to it over OTLP/HTTP (protobuf)
//! every `PLEXSPHERE_OTLP_INTERVAL_MS`:
//!
//! | instrument | attributes | what |
//! |---|---|---|
//! | `ratelimit.decisions` | `scope`, `outcome` | every decision, as `plexsphere_rate_budget_decisions_total` counts it |
//! | `ratelimit.fallbacks` | `scope`, `outcome` (`granted`, `refused`) | decisions a fallback bucket made while the store could not answer |
//!
//! Both are observable counters read from the same counter `/metrics` exposes, when the
//! export is due: a decision costs nothing more with the export on, and the two views cannot
//! disagree. They are cumulative, as Prometheus's are.
//!
//! The SDK's periodic reader exports from a thread of its own, outside the tokio runtime;
//! its requests are sent on the runtime the export was started on (`OnRuntime`), through
//! hyper, the HTTP stack the server already uses. There is no TLS: a collector runs beside
//! the replica (or a sidecar forwards) where the link must be encrypted.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::{MeterProvider as _, ObservableCounter};
use opentelemetry::KeyValue;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;

use crate::config::OtlpConfig;
use crate::observation::metrics::{Metrics, Outcome};

/// Why the export could not start or flush.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// The exporter could not be built from the configuration.
    #[error("cannot build the OTLP exporter")]
    Build(#[source] opentelemetry_otlp::ExporterBuildError),
    /// Metrics could not be pushed.
    #[error("cannot push metrics over OTLP")]
    Push(#[source] opentelemetry_sdk::error::OTelSdkError),
}

/// A running export; [`OtlpExport::stop`] pushes once more and ends it.
pub struct OtlpExport {
    provider: SdkMeterProvider,
    // The instruments live as long as the export; their callbacks read the counters.
    _instruments: [ObservableCounter<u64>; 2],
}

impl std::fmt::Debug for OtlpExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExport").finish_non_exhaustive()
    }
}

impl OtlpExport {
    /// Starts pushing `metrics` as `config` says. Call it on the tokio runtime that is to
    /// send the requests.
    ///
    /// # Errors
    /// [`OtlpError::Build`] when the exporter cannot be built.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(config: &OtlpConfig, metrics: Metrics) -> Result<OtlpExport, OtlpError> {
        // The collector answers within the interval or the push is dropped: the next one
        // carries the same cumulative counts.
        let timeout = config.interval.min(Duration::from_secs(10));
        let client = OnRuntime {
            client: Arc::new(opentelemetry_http::hyper::HyperClient::with_default_connector(timeout, None)),
            runtime: tokio::runtime::Handle::current(),
        };
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(config.metrics_url.clone())
            .with_timeout(timeout)
            .build()
            .map_err(OtlpError::Build)?;
        let reader = PeriodicReader::builder(exporter).with_interval(config.interval).build();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(Resource::builder().with_service_name("plexsphere").build())
            .build();
        let meter = provider.meter("plexsphere");
        let counted = metrics.clone();
        let decisions = meter
            .u64_observable_counter("ratelimit.decisions")
            .with_description(
                "Rate-budget decisions by scope and outcome (granted, refused, precheck_refused, \
                 fallback_granted, fallback_refused, shadow_refused, open_granted, error)",
            )
            .with_unit("{decision}")
            .with_callback(move |observer| {
                for (scope, outcome, count) in counted.decision_counts() {
                    observer.observe(count, &attributes(scope, outcome.as_str()));
                }
            })
            .build();
        let fallbacks = meter
            .u64_observable_counter("ratelimit.fallbacks")
            .with_description(
                "Rate-budget decisions a replica's fallback bucket made while the shared store could not answer",
            )
            .with_unit("{decision}")
            .with_callback(move |observer| {
                let counts = metrics.decision_counts();
                // Every scope and outcome, zeros included, so the series exist before the
                // first outage and a rate over them starts at zero.
                for scope in ratebudget::Scope::ALL {
                    for (outcome, name) in [(Outcome::fallback_granted, "granted"), (Outcome::fallback_refused, "refused")] {
                        let count = counts
                            .iter()
                            .find(|(counted, of, _)| *counted == scope && *of == outcome)
                            .map_or(0, |(_, _, count)| *count);
                        observer.observe(count, &attributes(scope, name));
                    }
                }
            })
            .build();
        tracing::info!(url = %config.metrics_url, every = ?config.interval, "pushing metrics over OTLP");
        Ok(OtlpExport { provider, _instruments: [decisions, fallbacks] })
    }

    /// Pushes the current counts now, waiting for the collector's answer.
    ///
    /// # Errors
    /// [`OtlpError::Push`] when they could not be pushed.
    pub async fn flush(&self) -> Result<(), OtlpError> {
        let provider = self.provider.clone();
        // The SDK blocks the calling thread until its reader thread has pushed.
        tokio::task::spawn_blocking(move || provider.force_flush())
            .await
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))
            .map_err(OtlpError::Push)
    }

    /// Pushes the last counts and stops the reader thread.
    pub async fn stop(self) {
        let provider = self.provider.clone();
        let stopped = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(error)) = stopped {
            tracing::warn!(%error, "the last OTLP push failed");
        }
    }
}

fn attributes(scope: ratebudget::Scope, outcome: &'static str) -> [KeyValue; 2] {
    [KeyValue::new("scope", scope.as_str()), KeyValue::new("outcome", outcome)]
}

/// An HTTP client for the SDK's reader thread that sends each request on the tokio runtime,
/// where hyper's connections need to run, and logs a push that failed (the SDK, built without
/// its internal logs, would drop it silently).
#[derive(Debug)]
struct OnRuntime {
    client: Arc<opentelemetry_http::hyper::HyperClient>,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move { client.send_bytes(request).await }).await;
        let answer = match sent {
            Ok(answer) => answer,
            Err(stopped) => Err(Box::new(stopped) as HttpError),
        };
        match &answer {
            Ok(response) if !response.status().is_success() => {
                tracing::warn!(status = %response.status(), "the OTLP collector refused a metrics push")
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "cannot push metrics to the OTLP collector"),
        }
        answer
    }
}
