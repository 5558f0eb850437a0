//! The checked-in C header is what cbindgen generates from the sources now.

#[test]
fn the_checked_in_header_is_current() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config =
        cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads capi/src")
        .write(&mut generated);
    let path = format!("{dir}/include/mrstack.h");
    if std::env::var_os("MRSTACK_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write the header");
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "capi/include/mrstack.h is not what capi/src declares: regenerate it with \
         `MRSTACK_BLESS=1 cargo test -p mrstack-capi --test header` and commit it"
    );
}
