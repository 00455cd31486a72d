"""The lock hierarchy: every lock in kstore, outermost first.

Kept in one place so a new lock gets a place in the order (ARCHITECTURE.md summarises it).

A thread holding a lock may take only locks listed
below it, never one above; leaves take nothing. Readers (Log.read, a StoreReader's kept logs)
take none.
  Spark staging dir flock       one write's staging directory (spark/staging.py), across
                                processes and hosts: held shared by a task while it stages (no
                                other kstore lock under it) and by the driver's commit across
                                its LogManager open (the store's .lock, waited on with backoff)
                                and appends; the collector only tries it exclusively, never
                                waits, and takes nothing under it (a rename)
  Consumer._lock                every user call of a consumer and its close against each other
                                and its poll timer's eviction (consumer.py, an RLock: a listener
                                called in poll may commit). A call tries it first: held by
                                another user call (ThreadGuard.owner, consumer_access.py), it
                                raises ConcurrentModificationError; held by the timer or a
                                close() from another thread, it waits. The timer takes it only
                                to evict (GroupMember.expire below it); close() joins the timer
                                after releasing it. Held across poll's wait (the timer waits,
                                then finds a fresh poll time)
  GroupMember._lock             one group member's state (group_membership.py): its owned
                                partitions and descriptors; held across its groups dir and
                                group.lock waits
  .kstore-groups dir flock      the groups dir itself, flocked exclusively across processes
                                (GroupDir.lock_groups_dir, group.lock's wait): a group's
                                directory is made only under it (GroupDir.make: a member
                                takes it under GroupMember._lock, holding no other flock,
                                then drops it); an admin
                                (GroupCoordinator.groups_locked: delete_group, --reset-offsets
                                --execute, one group at a time) holds it instead of group.lock
                                for a group with no directory, from its look to its write,
                                with the locks below: a first join waits one group's step
  group.lock flock              a consumer group's exclusive flock, across processes and threads
                                (group_files.py, a bounded polling wait): joins, leaves,
                                rebalances, group.json, and consumer-groups --reset-offsets
                                --execute's look and commit (one group's at a time; several
                                through groups_locked: in name order). Under it member and owner flocks are
                                only tried (never waited on), and store_group/group() take the
                                __consumer_offsets locks below (a rebalance's record waits
                                TASK_LOCK_WAIT_S at most, then is logged); nothing holding those waits
                                for group.lock (live_members only tries; delete_group takes
                                group.lock first)
  TopicDeletions._lock          one deletion tail at a time (topic_deletion.py): delete_topic
                                holds it across its renames, checkpoints, tombstones and the
                                record's drop; the retry task only tries it, create_topic's
                                retry and the manager's close() (holding nothing) wait for
                                it. Takes the registry, checkpoint and offsets locks below;
                                never taken under them (the producer's auto-creation, under
                                LogRegistry.lock, does not retry). The task's flock waits
                                under it last TASK_LOCK_WAIT_S (1 s) in all and sleep on
                                TopicDeletions._closing (an Event; close() sets it first)
  Cleaner.lock                  one clean at a time per OffsetMap (cleaner thread vs clean_now)
  LogCleaner._lock (= _done)    in-progress set, per-log TxnFilters; grab computes cleanable
                                ranges under it (reading new batch headers for the LSO)
  checkpoint_lock(path)         one per checkpoint file: snapshot + atomic write (checkpoint.py);
                                never taken under LogRegistry.lock (delete_topic writes after);
                                a managed open carrying a standalone start into it takes it
                                holding no other lock (start_file.carry_to_manager)
  LogRegistry.lock              the manager's registry lock (log_registry.py): registry changes
                                (create/delete/add/alter topics, start-up's publishing); appends,
                                the scheduled tasks and the cleaner read the registry without it
  LogNotifier._lock             a read-only log's wait_for catch-up (hints, then refresh, which
                                takes Log._lock) and re-opening its notification file, and the
                                list stamp it trusts for tail refreshes (notify.py); a woken
                                waiter's Log.refresh_tail runs under it (Log._lock, then
                                LogSegment._lock), its idle Log.catch_up_index without it. The
                                notification word is lock-free (atomics: arm, bump, the
                                writer's pre-wake at the start of Log.append, under Log._lock)
  OffsetsTopic _Writer.lock     one writer of a __consumer_offsets partition per coordinator
                                (offsets_topic.py): held across the partition flock below.
                                A Consumer's commit() and poll's auto-commit and rebalance
                                commit wait for both in pauses slept on its wakeup bell
                                (Wakeup.pause): wakeup() ends the wait, and so does a close()
                                not yet running, but for a running listener's commit; once
                                close() began, every commit wait (its own, the listeners'),
                                its leave's GroupMetadata append and its coordinator's close
                                end at close(timeout)'s deadline (then logged)
  __consumer_offsets-N flock    the partition directory's exclusive flock, across processes (a
                                bounded polling wait): every append, expiry tombstone and
                                compaction of the partition, the kept writable Log's reuse check;
                                taken and dropped by on_topics_deleted (wait_writers: a barrier).
                                The scheduler's tasks (deletion retry, offsets expiry)
                                wait for it TASK_LOCK_WAIT_S in all, ended by close()
                                (task_wait.py; OffsetsExpiry._closing, an Event), then put
                                their work off to their next run (the expiry's starts past
                                the partition it was put off at: round robin)
  GroupCoordinator _State.lock  a partition's read state (group_coordinator.py): refreshes its
                                read-only Log (Log._lock) and applies new records; taken under
                                the two above by expire_offsets/delete_group (decide under flock)
  StoreReader._lock             a StoreReader's kept logs (reader.py): a partition's first open,
                                refresh() (the rescan that drops stale logs) and close(), so
                                threads sharing one get the same Log and none is left unclosed;
                                takes Log._lock below (the open's refresh, close_handlers). Reads,
                                waits and refreshes of a kept log run without it
  Log._flush_lock               one flush of a log at a time; its fsyncs run under this only.
                                A standalone log's delete_records and truncations hold it
                                across the change (Log._lock) and the save of a moved start
                                (.kstore-log-start; a lowered one is saved before the cut,
                                log_start.py), so close() never comes between the two
  Log._lock                     the append lock: in-memory state, the segment list, the bytes
                                of an append. No fsync/msync waits and no scheduler hand-off
                                under it: flushes, a roll's flush (or its scheduling), the
                                retention dir fsync and delayed unlinks run after it is released
                                (Log._after_write). Exceptions: close(), the trim fsync of a roll
                                of a fully flushed log, truncate_fully_and_start_at's and the
                                cleaner swap's first directory fsync
                                A read-only log's refresh holds it too (its DirWatch state,
                                ro_refresh.py, is touched only there). Another exception: an
                                append that restarts the log's leader epoch after a truncation
                                removed its entry writes leader-epoch-checkpoint under it (once
                                per such truncation, as Kafka's assign on a leader's append),
                                and so does a truncation below the log end, whose new epoch
                                is in the file before a record goes (leader_epoch._before_cut)
                                A writable log's notification page is attached under it too
                                (LocalLog.attach_bell, once: at its first change, by the
                                changing thread; its first wait, by the waiter; its close; or
                                at open without a page or after a torn tail was cut): the
                                file's open, mmap and header write. Log._bell (None until then) is
                                written only there and read by the writer under it; a waiter
                                gets the Bell from attach_bell, so none sleeps on a page the
                                writer does not bump
  LeaderEpochFileCache._lock    a partition's leader epoch entries and the write of its
                                leader-epoch-checkpoint (leader_epoch.py; the write's fsyncs
                                run under it, so an older snapshot never replaces a newer one).
                                Under Log._lock only for in-memory updates (truncations, log
                                start changes) and the exceptions above; the file is otherwise
                                written after Log._lock is released, or at close. Takes nothing
                                but FileOps' leaves
  LogSegment._lock              a segment's mapping and descriptors (its flush fsyncs under it);
                                a read-only segment's validation and private index copies
                                (extended past their published count; readers take no lock),
                                the kept .log fd of a read-only last segment (segment_ro.py);
                                a lazy segment's size, read on first use (segment_reader.py
                                _load_size: a stat, or the fstat of mapping()) and settled
                                before a rename or deletion of its files (settle_size); the
                                flag is read without it and cleared after the size is set
  AbstractIndex._lock           an index's mapping, entries and length
  Runway.lock                   an active segment's runway (runway.py): alloc, populated, the
                                mapping it pre-faults, stopped. Taken by the writer's growth
                                (under Log._lock), by stop() at roll/close/truncation/unmap
                                (under LogSegment._lock) and by the pretoucher's thread holding
                                nothing else; takes no kstore lock (its FileOps calls may wait
                                on MarkerGate's leaves). Held for one step of zero-fill and
                                pre-faulting (pretouch.CHUNK, 1 MiB): what a writer or a roll
                                can wait for it
  leaves: AsyncWaiter._lock (async_consumer.py: the pending waits of every AsyncConsumer and
          the waiter thread's life; never held while it arms, refreshes or sleeps),
          Scheduler._cv (tasks run without it), Throttler._lock, progress bars' lock,
          GroupCoordinator._mutex / OffsetsTopic._mutex (their per-partition maps), the flock of
          .kstore-groups/offsets-topic.lock (taken before a writer lock, around one atomic write),
          the checkpoint-lock registry guard, KEPT.lock,
          LogDirFailureChannel's lock (offline dirs; taken under a failing Log's locks; its
          listeners run after it is released and take none: Log.fail sets a flag),
          Pretoucher._cv (pretouch.py: its queue, each runway's queued/target),
          MarkerGate._lock (marker_gate.py: the marker removals in flight and their error),
          gc_pause._lock (gc_pause.py: the count of loads under way and the gc switch; held
          only around them, so taken under whatever the loading thread holds),
          spark task_cache._lock (spark/task_cache.py: a worker's idle readers and its sweep
          timer; readers are refreshed, opened and closed outside it; an entry checked out
          belongs to one read, so its ColumnsPool takes no lock)
          and MarkerGate._serial (one call at a time to a FileOps with thread_safe = False,
          the crash harness's, while a removal runs)
  no lock: a Mapping's remembered batches (record tables, _mapping.pyx) are looked up,
          published, evicted and freed under the GIL; a table the columnar decode fills while
          the GIL is released is private to that call until published (Mapping.remember, which
          refuses a second table for a batch); a looked-up table is not used past Python code;
          freed at unmap
  no lock: a log dir's store identity (.kstore-id, spark/deploy.py): published once by
          link(2), which never replaces, so racing drivers agree on the first one linked; read
          by Spark tasks without a lock; no in-process state or cache

The first change to a file after a clean open (MarkerGate) waits for the clean-shutdown
marker's unlink and directory fsync begun at the open, under whatever locks its caller holds
(Log._lock for an append): once per open, another exception to "no fsync under Log._lock".
The removal's thread takes no kstore lock.

A Consumer (consumer.py, its SubscriptionState and Fetcher) is used by one thread, as Kafka's;
its one lock (Consumer._lock, above) keeps its poll timer's eviction and a close() from another
thread out of its calls (each holds it: consumer_access). Under it, and nothing else, it calls
GroupMember and GroupCoordinator (their locks) and logs' reads and waits (their locks, all
below it).

The notification word (notify.py) is lock-free: the writer bumps it under Log._lock (an atomic
and at most one FUTEX_WAKE), waiters sleep on it holding no lock. The page's hints (log end,
active base and size, log start) and list stamp are stored by the writer under Log._lock before
the bump and read by waiters without a lock: they only say where to look (the bytes read are
validated), and a torn read of them is followed by the bump that completes it.
Order that matters most: _flush_lock before Log._lock (a flush holds the first while waiting
for the second, so nothing under Log._lock may flush); LogRegistry.lock before Log._lock
(delete_topic closes logs under it, so Log code never calls into the manager).
"""
