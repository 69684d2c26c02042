"""What runs on the Redis node for the checkpoint store (``redis.py``), and what it
answers: the write and claim scripts, the keys and arguments they take, and their
replies read as ``Applied``. Every script first checks that its node is the primary the
sentinels name now (``PRIMARY_CHECK``): ``redis.py`` says why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.checkpoint.model import Applied, Flush, split_events

# The check every script starts with: ARGV[index] is the replication id of the primary
# the sentinels name ('' where there are none: nothing checked).
PRIMARY_CHECK = """
local function is_primary(expected)
  if expected == '' then return true end
  local info = redis.call('INFO', 'replication')
  return string.find(info, 'role:master', 1, true) ~= nil
    and string.find(info, 'master_replid:' .. expected, 1, true) ~= nil
end
"""
NOT_PRIMARY = "NOTPRIMARY this node is not the primary the sentinels name now"

# KEYS: record, events, state, lease, watch, epoch per run; ARGV: _write_args per run,
# then the primary's replication id (PRIMARY_CHECK). Returns, per run, an ``Applied``:
# 2 if fenced out, 5 if its log would have a gap, else whether a replica watches it.
_WRITE_RUN = """
local function write_run(k, a)
  local record, events, state, lease = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  local epoch = ARGV[a + 10]
  if (redis.call('GET', KEYS[k + 6]) or '0') ~= epoch then return 2 end
  local ttl = tonumber(ARGV[a + 6])
  if ttl <= 0 then
    redis.call('DEL', record, events, state, lease)
    return redis.call('EXISTS', KEYS[k + 5])
  end
  local flags, data = ARGV[a + 1], ARGV[a + 5]
  local have = 0  -- the last event the stored log has
  if string.find(flags, 'r') then
    redis.call('DEL', events)
  else
    local top = redis.call('XREVRANGE', events, '+', '-', 'COUNT', 1)[1]
    if top then have = tonumber(string.match(top[1], '%-(%d+)$')) end
  end
  -- A log that ends before this flush's first event would have a gap: a position in it
  -- would name another event than the client's at that position. Never stored.
  if data ~= '' and tonumber(ARGV[a + 3]) > have + 1 then return 5 end
  if ARGV[a + 2] ~= '' then redis.call('SET', record, ARGV[a + 2], 'PX', ttl) end
  -- Sent again after a write nobody acknowledged: the log may have it already.
  if data ~= '' and tonumber(ARGV[a + 4]) > have then
    redis.call('XADD', events, '0-' .. ARGV[a + 4], 'f', ARGV[a + 3], 'd', data)
  end
  if string.find(flags, 'e') then
    redis.call('PEXPIRE', record, ttl)
    redis.call('PEXPIRE', events, ttl)
  end
  redis.call('SET', state, ARGV[a + 7], 'PX', ttl)
  if ARGV[a + 8] ~= '' then
    redis.call('SET', lease, ARGV[a + 8], 'PX', ARGV[a + 9])
  else
    redis.call('DEL', lease)
  end
  if epoch ~= '0' then redis.call('SET', KEYS[k + 6], epoch, 'PX', ttl) end
  return redis.call('EXISTS', KEYS[k + 5])
end
"""
WRITE_SCRIPT = (
    PRIMARY_CHECK
    + _WRITE_RUN
    + f"""
if not is_primary(ARGV[#ARGV]) then return redis.error_reply('{NOT_PRIMARY}') end
local out = {{}}
for i = 0, #KEYS / 6 - 1 do
  out[i + 1] = write_run(i * 6, i * 10)
end
return out
"""
)

# KEYS: state, lease, epoch; ARGV: claim (unique to this claim), lease ms, the primary's
# replication id (PRIMARY_CHECK). The run's new epoch, or nil when the lease is held or
# the run is not stored. Idempotent: a claim sent again (its reply was lost, and
# redis-py retried it) finds its own lease and gets the epoch it raised, instead of
# losing to itself.
CLAIM_SCRIPT = (
    PRIMARY_CHECK
    + f"""
if not is_primary(ARGV[3]) then return redis.error_reply('{NOT_PRIMARY}') end
local held = redis.call('GET', KEYS[2])
if held == ARGV[1] then return tonumber(redis.call('GET', KEYS[3])) end
if held or redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
local epoch = redis.call('INCR', KEYS[3])
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[3], ttl) end
return epoch
"""
)


def write_args(f: Flush) -> list[bytes | str | int]:
    flags = ("r" if f.reset else "") + ("e" if f.expire or f.record is not None else "")
    return [
        flags or "-",
        f.record or b"",
        f.first_seq,
        f.last_seq,
        f.events,
        int(f.ttl * 1000),
        f.state,
        f.lease or "",
        int(f.lease_ttl * 1000),
        f.epoch,
    ]


def run_keys(run_id: str) -> tuple[str, str, str, str, str, str]:
    tag = f"rg:{{{run_id}}}:"
    return (
        tag + "record",
        tag + "events",
        tag + "state",
        tag + "lease",
        tag + "watch",
        tag + "epoch",
    )


def per_run(replies: Sequence[Any]) -> list[Applied]:
    """Each run's script reply, or FAILED for an error; raises if every run failed (the
    store is down, as on standalone)."""
    failures = [reply for reply in replies if isinstance(reply, BaseException)]
    if failures and len(failures) == len(replies):
        raise failures[0]
    return [
        Applied.FAILED if isinstance(reply, BaseException) else Applied(_applied(reply))
        for reply in replies
    ]


def _applied(reply: Any) -> int:
    return int(reply[0] if isinstance(reply, list) else reply)


def acknowledged(replies: Sequence[Any], replicated: bool) -> list[Applied]:
    """Script replies as ``Applied``; a write no replica acknowledged is UNREPLICATED
    (a fenced one stays FENCED: nothing was written)."""
    out = [Applied(_applied(reply)) for reply in replies]
    if replicated:
        return out
    return [a if a is Applied.FENCED else Applied.UNREPLICATED for a in out]


def log_entries(raw: list[Any], after: int) -> list[tuple[int, bytes]]:
    """The events of log entries after ``after``, each once: an entry sent again after a
    write nobody acknowledged may repeat events an earlier entry has."""
    out = []
    for entry_id, fields in raw:
        last = int(entry_id.split(b"-")[1])
        first = int(fields[b"f"])
        for seq, event in enumerate(split_events(fields[b"d"]), first):
            if seq > after and seq <= last:
                out.append((seq, event))
                after = seq
    return out
