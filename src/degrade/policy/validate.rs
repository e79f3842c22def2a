//! Validation: every raw field checked into the typed [`super::Policy`], each error naming the
//! field and the reason.

use super::raw::*;
use super::*;

pub(super) fn check_name(field: &str, name: &str) -> Result<(), PolicyError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{name:?} must be 1-64 characters of A-Z a-z 0-9 _ - ."),
        ))
    }
}

pub(super) fn check_ratio(field: &str, v: f64) -> Result<(), PolicyError> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{v} must be a ratio between 0 and 1"),
        ))
    }
}

pub(super) fn validate(raw: RawPolicy) -> Result<Policy, PolicyError> {
    let agents = crate::agents::AgentsPolicy::validate(raw.agents.unwrap_or_default())
        .map_err(|e| invalid(format!("agents.{}", e.field), e.reason))?;
    if !(50..=60_000).contains(&raw.evaluate_interval_ms) {
        return Err(invalid(
            "evaluate_interval_ms",
            "must be between 50 and 60000",
        ));
    }
    for (field, v) in [
        ("capacity_rps", raw.capacity_rps),
        ("fallback_capacity_rps", raw.fallback_capacity_rps),
    ] {
        if let Some(c) = v
            && !(c.is_finite() && c > 0.0)
        {
            return Err(invalid(field, "must be a positive number of requests/s"));
        }
    }
    if let Some(r) = raw.exit_demand_ratio
        && !(r.is_finite() && r > 0.0 && r <= 2.0)
    {
        return Err(invalid("exit_demand_ratio", "must be in (0, 2]"));
    }
    if raw.command_lease_ms < 3 * raw.evaluate_interval_ms {
        return Err(invalid(
            "command_lease_ms",
            "must be at least 3 evaluation intervals (it is refreshed every third of it)",
        ));
    }
    if raw.snapshot_stale_ms == 0 {
        return Err(invalid("snapshot_stale_ms", "must be positive"));
    }
    if raw.decision_history == 0 || raw.decision_history > 100_000 {
        return Err(invalid("decision_history", "must be between 1 and 100000"));
    }
    if raw.trend_window_secs < 5 {
        return Err(invalid("trend_window_secs", "must be at least 5"));
    }

    let mut features = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, f) in raw.features.into_iter().enumerate() {
        let field = format!("features[{i}]");
        check_name(&format!("{field}.name"), &f.name)?;
        if !seen.insert(f.name.clone()) {
            return Err(invalid(
                format!("{field}.name"),
                format!("duplicate feature {:?}", f.name),
            ));
        }
        let criticality = Criticality::parse(&f.criticality).ok_or_else(|| {
            invalid(
                format!("{field}.criticality"),
                format!("{:?} is not critical, default or sheddable", f.criticality),
            )
        })?;
        let disable_at = match f.disable_at_tier {
            None => None,
            Some(t) => {
                let tier = Tier::try_from(t)
                    .map_err(|e| invalid(format!("{field}.disable_at_tier"), e.to_string()))?;
                if tier == Tier::T0 {
                    return Err(invalid(
                        format!("{field}.disable_at_tier"),
                        "0 would disable it in normal operation; use 1-3",
                    ));
                }
                if criticality == Criticality::Critical {
                    return Err(invalid(
                        format!("{field}.disable_at_tier"),
                        format!("{:?} is critical (P0) and is never disabled", f.name),
                    ));
                }
                Some(tier)
            }
        };
        features.push(FeaturePolicy {
            name: f.name,
            criticality,
            disable_at,
        });
    }

    let t1 = validate_tier(
        "tiers.t1",
        Tier::T1,
        raw.tiers.t1.hold_down_secs,
        raw.tiers.t1.enter,
    )?;
    if raw.tiers.t1.params.is_some() {
        return Err(invalid(
            "tiers.t1.params",
            "tier 1 takes no params (features say what it sheds)",
        ));
    }
    let t2 = validate_tier(
        "tiers.t2",
        Tier::T2,
        raw.tiers.t2.hold_down_secs,
        raw.tiers.t2.enter,
    )?;
    let t3 = validate_tier(
        "tiers.t3",
        Tier::T3,
        raw.tiers.t3.hold_down_secs,
        raw.tiers.t3.enter,
    )?;

    let t2p: RawT2Params = match raw.tiers.t2.params {
        Some(v) => {
            serde_yaml::from_value(v).map_err(|e| invalid("tiers.t2.params", e.to_string()))?
        }
        None => {
            return Err(invalid(
                "tiers.t2.params",
                "required: model_route, max_tokens_cap, max_num_seqs",
            ));
        }
    };
    if !matches!(t2p.model_route.as_str(), "primary" | "fallback") {
        return Err(invalid(
            "tiers.t2.params.model_route",
            "must be `primary` or `fallback`",
        ));
    }
    if t2p.max_tokens_cap == 0 {
        return Err(invalid(
            "tiers.t2.params.max_tokens_cap",
            "must be positive",
        ));
    }
    if t2p.max_num_seqs == 0 {
        return Err(invalid("tiers.t2.params.max_num_seqs", "must be positive"));
    }
    let t3p: RawT3Params = match raw.tiers.t3.params {
        Some(v) => {
            serde_yaml::from_value(v).map_err(|e| invalid("tiers.t3.params", e.to_string()))?
        }
        None => {
            return Err(invalid(
                "tiers.t3.params",
                "required: admit_min_criticality, retry_after_base_secs, jitter_ratio, recovery_eta_max_secs",
            ));
        }
    };
    let admit = Criticality::parse(&t3p.admit_min_criticality).ok_or_else(|| {
        invalid(
            "tiers.t3.params.admit_min_criticality",
            "must be critical or default",
        )
    })?;
    if admit == Criticality::Sheddable {
        return Err(invalid(
            "tiers.t3.params.admit_min_criticality",
            "sheddable would shed nothing; use critical or default",
        ));
    }
    if t3p.retry_after_base_secs == 0 || t3p.retry_after_base_secs > 3600 {
        return Err(invalid(
            "tiers.t3.params.retry_after_base_secs",
            "must be between 1 and 3600",
        ));
    }
    check_ratio("tiers.t3.params.jitter_ratio", t3p.jitter_ratio)?;
    if t3p.recovery_eta_max_secs == 0 {
        return Err(invalid(
            "tiers.t3.params.recovery_eta_max_secs",
            "must be positive",
        ));
    }
    if let Some(r) = t3p.admit_capacity_ratio
        && !(r.is_finite() && r > 0.0 && r <= 2.0)
    {
        return Err(invalid(
            "tiers.t3.params.admit_capacity_ratio",
            "must be in (0, 2]",
        ));
    }

    let instances = raw.instances.map(validate_instances).transpose()?;
    let ramp = raw.admission_ramp.map(validate_ramp).transpose()?;
    let storm = raw.recovery_storm.map(validate_storm).transpose()?;

    Ok(Policy {
        evaluate_interval: Duration::from_millis(raw.evaluate_interval_ms),
        command_lease_ms: raw.command_lease_ms,
        snapshot_stale_ms: raw.snapshot_stale_ms,
        decision_history: raw.decision_history,
        trend_window_ms: raw.trend_window_secs * 1000,
        dry_run: raw.dry_run,
        features,
        tiers: [t1, t2, t3],
        t2: T2Params {
            model_route: t2p.model_route,
            max_tokens_cap: t2p.max_tokens_cap,
            max_num_seqs: t2p.max_num_seqs,
        },
        t3: T3Params {
            admit_min_criticality: admit,
            retry_after_base_secs: t3p.retry_after_base_secs,
            jitter_ratio: t3p.jitter_ratio,
            recovery_eta_max_ms: t3p.recovery_eta_max_secs * 1000,
            admit_capacity_ratio: t3p.admit_capacity_ratio,
        },
        agents,
        instances,
        ramp,
        storm,
        declared_capacity_rps: raw.capacity_rps,
        declared_fallback_capacity_rps: raw.fallback_capacity_rps,
        exit_demand_ratio: raw.exit_demand_ratio,
    })
}

pub(super) fn validate_instances(r: RawInstances) -> Result<InstancePolicy, PolicyError> {
    let k = &r.kv_usage;
    let f = "instances.kv_usage";
    check_ratio(&format!("{f}.watch_above_ratio"), k.watch_above_ratio)?;
    check_ratio(&format!("{f}.halve_above_ratio"), k.halve_above_ratio)?;
    check_ratio(&format!("{f}.exit_below_ratio"), k.exit_below_ratio)?;
    if k.halve_above_ratio < k.watch_above_ratio {
        return Err(invalid(
            format!("{f}.halve_above_ratio"),
            "must be at least watch_above_ratio",
        ));
    }
    if k.exit_below_ratio >= k.watch_above_ratio {
        return Err(invalid(
            format!("{f}.exit_below_ratio"),
            "must be below watch_above_ratio (hysteresis)",
        ));
    }
    for (name, v) in [
        ("watch_for_secs", k.watch_for_secs),
        ("halve_for_secs", k.halve_for_secs),
        ("drain_after_secs", k.drain_after_secs),
        ("hold_down_secs", k.hold_down_secs),
    ] {
        if v > 86_400 {
            return Err(invalid(format!("{f}.{name}"), "must be at most 86400"));
        }
    }
    if r.default_max_num_seqs < 2 {
        return Err(invalid(
            "instances.default_max_num_seqs",
            "must be at least 2 (it is halved)",
        ));
    }
    if r.forget_after_secs == 0 {
        return Err(invalid("instances.forget_after_secs", "must be positive"));
    }
    Ok(InstancePolicy {
        kv: InstanceKvPolicy {
            watch_above: k.watch_above_ratio,
            watch_for_ms: k.watch_for_secs * 1000,
            halve_above: k.halve_above_ratio,
            halve_for_ms: k.halve_for_secs * 1000,
            drain_after_ms: k.drain_after_secs * 1000,
            exit_below: k.exit_below_ratio,
            hold_down_ms: k.hold_down_secs * 1000,
        },
        default_max_num_seqs: r.default_max_num_seqs,
        forget_after_ms: r.forget_after_secs * 1000,
    })
}

pub(super) fn validate_ramp(r: RawRamp) -> Result<RampPolicy, PolicyError> {
    let f = "admission_ramp";
    if !(r.start_ratio.is_finite() && r.start_ratio > 0.0 && r.start_ratio < 1.0) {
        return Err(invalid(
            format!("{f}.start_ratio"),
            "must be above 0 and below 1",
        ));
    }
    if !(r.step_ratio.is_finite() && r.step_ratio > 0.0 && r.step_ratio <= 1.0) {
        return Err(invalid(
            format!("{f}.step_ratio"),
            "must be above 0 and at most 1",
        ));
    }
    if r.step_interval_secs == 0 || r.step_interval_secs > 3600 {
        return Err(invalid(
            format!("{f}.step_interval_secs"),
            "must be between 1 and 3600",
        ));
    }
    if r.capacity_window_secs < 10 || r.capacity_window_secs > 86_400 {
        return Err(invalid(
            format!("{f}.capacity_window_secs"),
            "must be between 10 and 86400",
        ));
    }
    if !(r.min_capacity_rps.is_finite() && r.min_capacity_rps >= 0.0) {
        return Err(invalid(
            format!("{f}.min_capacity_rps"),
            "must be a non-negative number",
        ));
    }
    Ok(RampPolicy {
        start_ratio: r.start_ratio,
        step_ratio: r.step_ratio,
        step_interval_ms: r.step_interval_secs * 1000,
        capacity_window_ms: r.capacity_window_secs * 1000,
        min_capacity_rps: r.min_capacity_rps,
    })
}

pub(super) fn validate_storm(r: RawStorm) -> Result<StormPolicy, PolicyError> {
    let f = "recovery_storm";
    if r.periods_secs.is_empty() || r.periods_secs.len() > 8 {
        return Err(invalid(
            format!("{f}.periods_secs"),
            "must list 1-8 periods",
        ));
    }
    if !(16..=600).contains(&r.window_secs) {
        return Err(invalid(
            format!("{f}.window_secs"),
            "must be between 16 and 600",
        ));
    }
    for p in &r.periods_secs {
        if *p < 2 || p * 2 > r.window_secs {
            return Err(invalid(
                format!("{f}.periods_secs"),
                format!("{p} must be at least 2 and at most half of window_secs"),
            ));
        }
    }
    if !(r.min_autocorrelation.is_finite()
        && r.min_autocorrelation > 0.0
        && r.min_autocorrelation < 1.0)
    {
        return Err(invalid(
            format!("{f}.min_autocorrelation"),
            "must be above 0 and below 1",
        ));
    }
    if !(r.min_rate_rps.is_finite() && r.min_rate_rps >= 0.0) {
        return Err(invalid(
            format!("{f}.min_rate_rps"),
            "must be a non-negative number",
        ));
    }
    if r.min_for_secs_after_t3 > 600 {
        return Err(invalid(
            format!("{f}.min_for_secs_after_t3"),
            "must be at most 600",
        ));
    }
    Ok(StormPolicy {
        periods_secs: r.periods_secs,
        window_secs: r.window_secs,
        min_autocorrelation: r.min_autocorrelation,
        min_rate_rps: r.min_rate_rps,
        watch_after_t3_ms: r.watch_after_t3_secs * 1000,
        min_for_after_t3_ms: r.min_for_secs_after_t3 * 1000,
    })
}

pub(super) fn validate_tier(
    field: &str,
    tier: Tier,
    hold_down_secs: u64,
    enter: Vec<RawCondition>,
) -> Result<TierPolicy, PolicyError> {
    if hold_down_secs > 86_400 {
        return Err(invalid(
            format!("{field}.hold_down_secs"),
            "must be at most 86400",
        ));
    }
    let mut out = Vec::new();
    for (i, c) in enter.into_iter().enumerate() {
        let f = format!("{field}.enter[{i}]");
        let ratio = |signal: Signal, r: RawRatio, name: &str| -> Result<Condition, PolicyError> {
            check_ratio(&format!("{f}.{name}.above_ratio"), r.above_ratio)?;
            check_ratio(&format!("{f}.{name}.exit_below_ratio"), r.exit_below_ratio)?;
            if r.exit_below_ratio >= r.above_ratio {
                return Err(invalid(
                    format!("{f}.{name}.exit_below_ratio"),
                    format!(
                        "{} must be below above_ratio {} (hysteresis)",
                        r.exit_below_ratio, r.above_ratio
                    ),
                ));
            }
            Ok(Condition::Threshold {
                signal,
                above: r.above_ratio,
                exit_below: r.exit_below_ratio,
                for_ms: r.for_secs * 1000,
            })
        };
        let secs = |signal: Signal, r: RawSecs, name: &str| -> Result<Condition, PolicyError> {
            let ok = r.above_secs.is_finite()
                && r.above_secs > 0.0
                && r.exit_below_secs.is_finite()
                && r.exit_below_secs >= 0.0;
            if !ok || r.exit_below_secs >= r.above_secs {
                return Err(invalid(
                    format!("{f}.{name}"),
                    "above_secs must be positive and exit_below_secs below it (hysteresis)",
                ));
            }
            Ok(Condition::Threshold {
                signal,
                above: r.above_secs,
                exit_below: r.exit_below_secs,
                for_ms: r.for_secs * 1000,
            })
        };
        let level = |signal: Signal, r: RawLevel| -> Result<Condition, PolicyError> {
            if !(r.above.is_finite() && r.above > 0.0 && r.exit_below.is_finite())
                || r.exit_below < 0.0
                || r.exit_below >= r.above
            {
                return Err(invalid(
                    format!("{f}.{}", signal.trigger()),
                    "above must be positive and exit_below in [0, above) (hysteresis)",
                ));
            }
            Ok(Condition::Threshold {
                signal,
                above: r.above,
                exit_below: r.exit_below,
                for_ms: r.for_secs * 1000,
            })
        };
        let cond = match c.one(&f)? {
            OneCondition::GpuUtil(r) => ratio(Signal::GpuUtil, r, "gpu_util")?,
            OneCondition::KvUsage(r) => ratio(Signal::KvUsage, r, "kv_usage")?,
            OneCondition::Vram(r) => ratio(Signal::Vram, r, "vram")?,
            OneCondition::QueueDepth(r) => {
                if r.exit_below >= r.above {
                    return Err(invalid(
                        format!("{f}.queue_depth.exit_below"),
                        "must be below `above` (hysteresis)",
                    ));
                }
                Condition::Threshold {
                    signal: Signal::QueueDepth,
                    above: r.above as f64,
                    exit_below: r.exit_below as f64,
                    for_ms: r.for_secs * 1000,
                }
            }
            OneCondition::SloAlert(a) => {
                if a.slo.trim().is_empty() {
                    return Err(invalid(format!("{f}.slo_alert.slo"), "must not be empty"));
                }
                if a.severity.trim().is_empty() {
                    return Err(invalid(
                        format!("{f}.slo_alert.severity"),
                        "must not be empty",
                    ));
                }
                Condition::SloAlert {
                    slo: a.slo,
                    severity: a.severity,
                }
            }
            OneCondition::Alertmanager(a) => {
                if a.alertname.trim().is_empty() {
                    return Err(invalid(
                        format!("{f}.alertmanager.alertname"),
                        "must not be empty",
                    ));
                }
                Condition::Alertmanager {
                    alertname: a.alertname,
                }
            }
            OneCondition::TtftP99(r) => secs(Signal::TtftP99, r, "ttft_p99")?,
            OneCondition::QueueWaitP99(r) => secs(Signal::QueueWaitP99, r, "queue_wait_p99")?,
            OneCondition::ExpectedWait(r) => secs(Signal::ExpectedWait, r, "expected_wait")?,
            OneCondition::Demand(r) => level(Signal::DemandRatio, r)?,
            OneCondition::FallbackDemand(r) => level(Signal::FallbackDemandRatio, r)?,
            OneCondition::Jump(j) => {
                let g = format!("{f}.p99_jump");
                let signal = Signal::parse_latency(&j.signal).ok_or_else(|| {
                    invalid(
                        format!("{g}.signal"),
                        format!("{:?} is not ttft_p99 or queue_wait_p99", j.signal),
                    )
                })?;
                if !(j.factor.is_finite() && j.factor > 1.0) {
                    return Err(invalid(format!("{g}.factor"), "must be above 1"));
                }
                if !(2..=600).contains(&j.window_secs) {
                    return Err(invalid(
                        format!("{g}.window_secs"),
                        "must be between 2 and 600",
                    ));
                }
                if !(j.min_secs.is_finite() && j.min_secs > 0.0) {
                    return Err(invalid(format!("{g}.min_secs"), "must be positive"));
                }
                Condition::Jump {
                    signal,
                    factor: j.factor,
                    window_ms: j.window_secs * 1000,
                    min_value: j.min_secs,
                }
            }
            OneCondition::NewPattern(p) => {
                let ok = p.above_per_min.is_finite()
                    && p.above_per_min > 0.0
                    && p.exit_below_per_min >= 0.0;
                if !ok || p.exit_below_per_min >= p.above_per_min {
                    return Err(invalid(
                        format!("{f}.new_pattern"),
                        "above_per_min must be positive and exit_below_per_min below it (hysteresis)",
                    ));
                }
                Condition::Threshold {
                    signal: Signal::NewPatternRate,
                    above: p.above_per_min,
                    exit_below: p.exit_below_per_min,
                    for_ms: 0,
                }
            }
        };
        out.push(cond);
    }
    Ok(TierPolicy {
        tier,
        hold_down_ms: hold_down_secs * 1000,
        enter: out,
    })
}
