//! Adapters changed while the service serves (`Kev::add_adapter`, `Kev::remove_adapter`), on kev-mini and its two
//! trained fine-tunes: an adapter added live answers bit for bit as the same adapter loaded at start, and the
//! others do not move; a bad directory is refused with the same message as at start; a removed adapter's name
//! answers 404 while a job admitted before the removal finishes on it, its cache entries and pins go, and the
//! adapter itself is dropped once its last job is done.

use kev_decide::{AdapterDir, LiveError, Refusal, load_cpu_adapters};
use kev_engine::Arm;

use crate::adapters::{answer, bits, cases, dir_of, multi, settings, spec, with_model};

/// kev-mini served unmerged from its release files, no further adapter: the server that takes them live.
fn live() -> kev_decide::Kev<kev_engine::CpuBackend> {
    load_cpu_adapters(&spec(&dir_of("kev"), Arm::Fp32, settings()), &[])
        .unwrap()
        .0
        .with_default_names("kev", &["kev-latest".into(), "jev-latest".into()])
}

#[test]
fn an_adapter_added_live_answers_as_if_loaded_at_start_and_bad_ones_are_refused_alike() {
    let kev = live();
    assert!(kev.live_adapters());
    let at_start = multi(Arm::Fp32);
    let card = kev.add_adapter("ops", dir_of("ops")).unwrap();
    assert_eq!(card["x_adapter"], "ops");
    assert!(card["x_adapter_bytes"].as_u64().unwrap() > 0);
    assert_eq!(kev.adapters().len(), 2);
    for case in cases().iter().take(6) {
        for name in ["ops", "kev"] {
            let body = with_model(&case.body, name);
            assert_eq!(
                bits(&answer(&kev, &body, name)),
                bits(&answer(&at_start, &body, name)),
                "{}: {name} answers otherwise live",
                case.id
            );
        }
    }
    // Names already served, the default adapter, an unknown one.
    assert!(matches!(
        kev.add_adapter("ops", dir_of("support")),
        Err(LiveError::Taken(_))
    ));
    assert!(matches!(
        kev.add_adapter("kev-latest", dir_of("support")),
        Err(LiveError::Taken(_))
    ));
    assert!(matches!(
        kev.remove_adapter("kev"),
        Err(LiveError::Default(_))
    ));
    assert!(matches!(
        kev.remove_adapter("nope"),
        Err(LiveError::Unknown(_))
    ));
    // A directory made for another base: the message the start gives, nothing served changes.
    let other = AdapterDir {
        name: "other".into(),
        dir: crate::support::mini().join("../release/kev"),
    };
    let at_load = load_cpu_adapters(
        &spec(&dir_of("kev"), Arm::Fp32, settings()),
        std::slice::from_ref(&other),
    )
    .err()
    .unwrap()
    .to_string();
    let live_err = kev
        .add_adapter("other", other.dir.clone())
        .unwrap_err()
        .to_string();
    assert_eq!(live_err, at_load);
    assert_eq!(kev.adapters().len(), 2);
    // A merged (single-adapter, default form) service does not take adapters live.
    let merged = load_cpu_adapters(
        &kev_decide::LoadSpec {
            form: kev_decide::WeightForm::Merged,
            ..spec(&dir_of("kev"), Arm::Fp32, settings())
        },
        &[],
    )
    .unwrap()
    .0;
    assert!(!merged.live_adapters());
    assert!(matches!(
        merged.add_adapter("ops", dir_of("ops")),
        Err(LiveError::NotOffered(_))
    ));
}

#[test]
fn a_removed_adapter_finishes_its_jobs_and_goes_with_its_cache_and_pins() {
    let kev = live();
    kev.add_adapter("support", dir_of("support")).unwrap();
    let case = &cases()[0];
    // A state of a few hundred tokens: its prefix is cached (and pinned) under its adapter.
    let mut request: serde_json::Value = serde_json::from_str(&case.body).unwrap();
    let long = format!("{} ", request["state"]).repeat(12);
    request["state"] = serde_json::Value::String(long);
    let body = with_model(&request.to_string(), "support");
    let reference = answer(&multi(Arm::Fp32), &body, "support");
    // Its state cached, and pinned.
    assert_eq!(bits(&answer(&kev, &body, "support")), bits(&reference));
    let cached = kev.stats().cache.entries;
    assert!(cached > 0);
    let pin = serde_json::json!({"model": "support", "state": request["state"]}).to_string();
    let order = kev_decide::PinOrder {
        id: "pin-1".into(),
        owner: None,
        ttl: std::time::Duration::from_secs(60),
        share: None,
    };
    let pin_job = kev
        .admit_pin(kev_decide::Body::bytes(pin.as_bytes()), &order)
        .unwrap();
    assert!(kev.run(&[&pin_job])[0].is_ok());
    drop(pin_job);
    // A pin exists once its request is answered (the front end commits it then).
    kev.pinned().commit("pin-1").unwrap();
    assert!(kev.pinned().info("pin-1", None).is_some());
    // A job admitted before the removal.
    let held = kev.admit(&body).unwrap();
    kev.remove_adapter("support").unwrap();
    // New requests naming it: 404; its cache entries and pins are gone.
    match kev.admit(&body) {
        Err(r @ Refusal::AdapterGone(_)) => assert_eq!(r.status(), 404),
        other => panic!(
            "expected the removed adapter's 404, got {:?}",
            other.map(|_| ())
        ),
    }
    assert!(kev.stats().cache.entries < cached);
    assert!(kev.pinned().info("pin-1", None).is_none());
    assert_eq!(kev.adapters().len(), 1);
    // The held job finishes on it, byte for byte; the adapter waits for it, then goes.
    assert_eq!(kev.retired_adapters(), 1);
    let got = kev.run(&[&held]).pop().unwrap().unwrap();
    assert_eq!(bits(&got.probabilities), bits(&reference));
    drop(held);
    // The next pass drops it.
    answer(&kev, &with_model(&request.to_string(), "kev"), "kev");
    assert_eq!(kev.retired_adapters(), 0);
    // And nothing of its cached the held job's run: its name can be loaded again, answering as before.
    kev.add_adapter("support", dir_of("support")).unwrap();
    assert_eq!(bits(&answer(&kev, &body, "support")), bits(&reference));
}
