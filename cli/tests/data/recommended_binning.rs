resource_stack![
    Cuda::new(&ctx)?,
    Pool { initial: 3 GiB, max: 3 GiB },
    Binning,
]
