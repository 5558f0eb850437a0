resource_stack![
    Cuda::new(&ctx)?,
    Pool { initial: 2.8 GiB, max: 2.8 GiB },
]
