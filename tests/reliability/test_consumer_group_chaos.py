"""Issue 15's chaos test: N producer threads (a LogManager in this process), 3 consumer
processes of one group, members SIGKILLed and restarted at random for 60 s. Every record is
consumed at least once, duplicates only after a member's last commit (counted, filed for the
README), no partition owned or read by two live members at once, committed offsets never go
backwards (tests/consumer_chaos.py says how each is proved)."""
import consumer_chaos


def test_consumer_group_chaos_60s(tmp_path, watchdog, reliability_counts):
    watchdog(300)
    res = consumer_chaos.run(str(tmp_path), seconds=60, seed=15)
    assert res.kills >= 20 and res.records > 10_000
    reliability_counts["consumer_group_chaos"] = {
        "seconds": 60, "records": res.records, "duplicates": res.duplicates, "kills": res.kills,
        "member_processes": res.incarnations, "assignments": res.rebalances}
    print(f"chaos 60 s: {res}")
