//! Replaying an Envoy access log: bad lines named by number, headers the log lacks named
//! up front, the rest played through the fleet.

use super::{lab_dir, sluice_lab};

#[test]
fn a_log_is_replayed_with_its_bad_lines_and_missing_headers_reported() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut log = String::new();
    // 40 requests of one user in 2 s (JSON lines), 10 in the default text format (which
    // carries no x-user), one line that is neither.
    for i in 0..40 {
        log.push_str(&format!(
            "{{\"start_time\":\"2026-12-04T10:00:{:02}.{:03}Z\",\"method\":\"GET\",\"path\":\"/api/items\",\"x-user\":\"alice\"}}\n",
            i / 20,
            (i % 20) * 50
        ));
    }
    log.push_str("garbage that is no log line\n");
    for i in 0..10 {
        log.push_str(&format!(
            "[2026-12-04T10:00:02.{:03}Z] \"GET /api/items HTTP/1.1\" 200 - 0 12 3 2 \"10.1.2.3\" \"curl/8\" \"id-{i}\" \"shop\" \"10.0.0.9:80\"\n",
            i * 10
        ));
    }
    let path = dir.path().join("access.log");
    std::fs::write(&path, log).expect("written");
    let config = dir.path().join("per-user.json");
    std::fs::write(
        &config,
        r#"{"policies":[{"name":"per-user","key":[{"header":"x-user"}],"rate":"5/second","burst":5,"on_missing_key":"skip"}]}"#,
    )
    .expect("written");
    let out = dir.path().join("report");
    let (succeeded, stderr) = sluice_lab("replay", &path, &config, &out, &["--proxies", "1", "--speed", "2"]);
    assert!(succeeded, "{stderr}");
    assert!(stderr.contains("line 41:"), "the bad line is named: {stderr}");
    assert!(stderr.contains("1 lines could not be read"), "{stderr}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).expect("a summary")).expect("JSON");
    assert_eq!(summary["requests"], 50, "every good line is replayed");
    let policy = &summary["policies"][0];
    // alice: 40 requests every 25 ms of replay (twice the pace), the last at 0.975 s,
    // against 5 saved and 5/s: 5 + ⌊5 × 0.975⌋.
    assert_eq!(policy["allowed"], 9, "{policy}");
    assert_eq!(policy["offered"], 40, "the text lines carry no x-user: skipped, as configured");
}

#[test]
fn a_log_whose_lines_lack_a_header_the_policies_read_says_so_before_replaying() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("access.log");
    std::fs::write(
        &path,
        "[2026-12-04T10:00:00.000Z] \"GET / HTTP/1.1\" 200 - 0 0 1 1 \"-\" \"curl\" \"id\" \"shop\" \"-\"\n",
    )
    .expect("written");
    let config = lab_dir().join("configs/identity-local.json");
    let out = dir.path().join("report");
    let (succeeded, stderr) = sluice_lab("replay", &path, &config, &out, &[]);
    assert!(succeeded, "{stderr}");
    assert!(stderr.contains("no line carries header x-user"), "{stderr}");
}

#[test]
fn a_replayed_log_gives_the_same_report_whatever_the_number_of_threads() {
    // 1 200 requests of 30 users over 6 s across 4 proxies, against a global lease
    // budget: the proxies' calls to the counter service are what threads could reorder.
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut log = String::new();
    for i in 0..1_200u32 {
        let (second, milli) = (i / 200, (i % 200) * 5);
        log.push_str(&format!(
            "{{\"start_time\":\"2026-12-04T10:00:{second:02}.{milli:03}Z\",\"method\":\"GET\",\"path\":\"/api/items\",\"x-user\":\"user-{}\"}}\n",
            (i * 7) % 30
        ));
    }
    let path = dir.path().join("access.log");
    std::fs::write(&path, log).expect("written");
    let config = lab_dir().join("configs/identity-lease-fail-closed.json");
    let summary = |threads: &str| {
        let out = dir.path().join(format!("report-{threads}"));
        let (succeeded, stderr) = sluice_lab("replay", &path, &config, &out, &["--proxies", "4", "--threads", threads]);
        assert!(succeeded, "{stderr}");
        std::fs::read(out.join("summary.json")).expect("a summary")
    };
    let one = summary("1");
    let three = summary("3");
    let parsed: serde_json::Value = serde_json::from_slice(&one).expect("JSON");
    assert_eq!(parsed["requests"], 1_200, "every line is replayed");
    assert!(parsed["callouts"].as_u64().is_some_and(|c| c > 50), "the proxies call the service: {parsed}");
    assert_eq!(String::from_utf8_lossy(&one), String::from_utf8_lossy(&three));
}

#[test]
fn a_json_log_with_envoys_underscored_header_fields_is_replayed_with_those_headers() {
    let dir = tempfile::tempdir().expect("a temp dir");
    // As Envoy 1.40 writes a json_format of `"x_user": "%REQ(X-USER)%"`: 12 requests of
    // one user in 1.1 s.
    let mut log = String::new();
    for i in 0..12 {
        log.push_str(&format!(
            "{{\"start_time\":\"2026-12-04T10:00:0{}.{:03}Z\",\"method\":\"GET\",\"path\":\"/api/items\",\"x_user\":\"bob\",\"response_code\":200}}\n",
            i / 10,
            (i % 10) * 100
        ));
    }
    let path = dir.path().join("access.log");
    std::fs::write(&path, log).expect("written");
    let config = dir.path().join("per-user.json");
    std::fs::write(
        &config,
        r#"{"policies":[{"name":"per-user","key":[{"header":"x-user"}],"rate":"1/hour","burst":5,"on_missing_key":"skip"}]}"#,
    )
    .expect("written");
    let out = dir.path().join("report");

    let (succeeded, stderr) = sluice_lab("replay", &path, &config, &out, &["--proxies", "1"]);

    assert!(succeeded, "{stderr}");
    assert!(!stderr.contains("no line carries"), "{stderr}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).expect("a summary")).expect("JSON");
    let policy = &summary["policies"][0];
    assert_eq!((&policy["offered"], &policy["allowed"]), (&serde_json::json!(12), &serde_json::json!(5)), "{policy}");
}

#[test]
fn replay_help_names_the_json_fields_it_reads() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-lab"))
        .args(["replay", "--help"])
        .output()
        .expect("the binary runs");

    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("`x_user` is `x-user`") && text.contains("start_time"), "{text}");
}
