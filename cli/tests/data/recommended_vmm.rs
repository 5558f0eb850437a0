resource_stack![
    VirtualMemory::new(
        DevicePages::new(&ctx)?,
        VirtualMemoryConfig {
            max: 3_006_477_107, // 2.8 GiB
            cache: 3_006_477_107,
            ..Default::default()
        },
    )?,
]
