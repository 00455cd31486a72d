"""The `kstore` command and its tools (Kafka's bin/ scripts over a local store): argparse and
dispatch in `cli`, operator commands in `admin`, console producer/consumer in `console`,
DumpLogSegments in `dump`, benchmarks in `bench`/`bench_spark`, terminal progress in `progress`.
Nothing in the engine imports this package."""
