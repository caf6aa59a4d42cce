//! Upstream's own flag (issue #30): `--user-agent`, repeatable, reaches the client.

use ccm_provider_openstack::OpenStackProvider;
use ccm_provider_openstack::client::DEFAULT_USER_AGENT;

const CONFIG: &str = "[Global]\nauth-url = http://127.0.0.1:1/identity\nusername = u\n\
                      password = p\nproject-name = demo\ndomain-name = Default\nregion = r1\n";

fn provider(args: &[&str]) -> Result<OpenStackProvider, String> {
    let ext = ccm_provider_openstack::extensions();
    let argv = ["cloud-controller-manager-openstack", "--cloud-provider=openstack"];
    ccm_core::manager::parse_flags(&ext, argv.iter().chain(args).copied())
        .map_err(|e| e.to_string())?;
    OpenStackProvider::from_command_line(Some(CONFIG.as_bytes()), &ext.parsed)
        .map_err(|e| e.to_string())
}

#[test]
fn user_agent_values_are_sent_by_the_client_last_first_as_upstream() {
    let p = provider(&["--user-agent=first/1", "--user-agent", "second/2"]).unwrap();
    assert_eq!(&*p.client().user_agent(), format!("second/2 first/1 {DEFAULT_USER_AGENT}"));

    let plain = provider(&[]).unwrap();
    assert_eq!(&*plain.client().user_agent(), DEFAULT_USER_AGENT);

    let err = provider(&["--user-agent=bad\u{7}value"]).err().unwrap();
    assert!(err.contains("--user-agent"), "{err}");
    assert!(!err.contains("bad"), "the value is not quoted: {err}");
}
