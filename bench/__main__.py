import sys

if sys.argv[1:2] == ["arm64"]:  # the emulated linux/arm64 end-to-end check
    from bench.arm64 import main as arm64_main

    sys.exit(arm64_main(sys.argv[2:]))

if sys.argv[1:2] == ["promote"]:  # cross-registry promotion in bounded memory
    from bench.promote import main as promote_main

    sys.exit(promote_main(sys.argv[2:]))

if sys.argv[1:2] == ["promote-worker"]:  # the measured process of `bench promote`
    from bench.promote import worker

    sys.exit(worker(sys.argv[2:]))

if sys.argv[1:2] == ["pull"]:  # containerd pulls of the gzip tag and its zstd twin
    from bench.pull import main as pull_main

    sys.exit(pull_main(sys.argv[2:]))

if sys.argv[1:2] == ["pull-twin"]:  # the measured process of `bench pull`: promote, then twin
    from bench.pull import twin_worker

    sys.exit(twin_worker(sys.argv[2:]))

if sys.argv[1:2] == ["twin"]:  # publish's zstd twin: layers at once, the local cache
    from bench.twin import main as twin_main

    sys.exit(twin_main(sys.argv[2:]))

if sys.argv[1:2] == ["catalog"]:  # builder catalog on a 200-tag registry
    from bench.catalog import main as catalog_main

    sys.exit(catalog_main(sys.argv[2:]))

if sys.argv[1:2] == ["siblings"]:  # the bytes a node holding one image pulls for its siblings
    from bench.siblings import main as siblings_main

    sys.exit(siblings_main(sys.argv[2:]))

if sys.argv[1:2] == ["reproduce"]:  # reproducible images and rebuild deltas
    from bench.reproduce import main as reproduce_main

    sys.exit(reproduce_main(sys.argv[2:]))

from bench.runner import main

sys.exit(main())
