-- sluice-counter: one atomic decision over one or several counters.
--
-- Runs shared-store's algorithms (shared-store/src/limit/: decide, charge, credit,
-- status) with exactly the same answers, in Lua doubles: every integer below stays
-- under 2^53 for limits inside the numeric envelope the service validates
-- (protocol/src/limit.rs). Times are whole microseconds (Redis TIME);
-- results are nanoseconds, as in shared-store.
--
-- Redis runs a script atomically and never expires a key in the middle of one, so the
-- reads, the decision and the writes below cannot interleave with another decision.
--
-- KEYS[i]  state key of entry i (i = 1..n); all share one hash tag (one Redis Cluster
--          slot). A lease, a charge or a credit has one entry, or two under an
--          operator's clamp (the policy's counter, then the clamp's). A charge or a
--          credit with an id has KEYS[n + 1]: the key that remembers the id with its
--          first answer, "charged forgiven" or "credited forgiven" (same hash tag;
--          charge and credit ids have keys of their own, see charge_key and credit_key
--          in the service's api.rs)
-- ARGV[1]  time override in microseconds, "" in production (tests only)
-- ARGV[2]  "check", "lease", "charge" or "credit"
-- ARGV[3]  tokens asked for (lease), max_debt (charge: each counter's own bound is the
--          smaller of it and its capacity), when the credited units were spent in us
--          (credit: spent_at_ns / 1000, floored), else 0
-- ARGV[4]  n, the number of entries
-- ARGV[5 + 7(i-1) ..] entry i: code, p1, p2, p3, p4, cost, expires_us (for a lease,
--          cost is min_tokens, the fewest worth granting; for a credit, the units to
--          give back; expires_us: when the counter may be forgotten whatever it holds,
--          a clamp's counter at its override's end, in us; 0 for none)
-- ARGV[5 + 7n] a charge or a credit: how long its id is remembered, in ms (the plan's
--          id_ttl_ms: MIN_ID_TTL_MS to CHARGE_ID_TTL_MS, validated by the service)
--   tb  token bucket  p1 = amount/g, p2 = per_us/g, p3 = burst
--   lb  leaky bucket  p1 = amount/g, p2 = per_us/g, p3 = max_queue, p4 = max_wait_us
--   fw  fixed window  p1 = limit, p2 = window_ms
--   sw  sliding window  p1 = limit, p2 = window_ms
--   sl  sliding log   p1 = limit, p2 = window_ms
-- An unknown code is an error (the script stops before writing anything): a code the
-- service sends and this script does not know is a bug, never another algorithm.
--
-- State (a string, written with SET .. PX so every key has a TTL): the signature of
-- the limit it was decided under, "code.p1.p2.p3.p4" (the service's StoreLimit::signature),
-- then the numbers, whose first field is the latest time (us) the key was decided at;
-- time never runs backwards for a key:
--   buckets  "sig last debt"                 debt = GCRA's tat - now, in units of 1000*g/amount ns
--   windows  "sig last index count previous"
--   log      "sig last at1 cost1 at2 cost2 ..."   (at in us)
-- A state decided under another signature (a policy whose numbers changed without a
-- version bump) is carried over to the request's limit first, exactly as
-- shared_store::Limit::adopt does (adopt below).
--
-- Reply: {sec, usec, admitted, granted, duplicate, forgiven, refill_after_ns,
-- carry_forgiven, then per entry: verdict, limit, remaining, reset_after_ns, wait_ns};
-- verdict 0 allowed, 1 delayed (wait = delay), 2 rejected (wait = retry_after, -1 =
-- never), 3 exceeds. carry_forgiven: the units of debt the carry-overs of this call could
-- not keep (adopt). For a lease, granted is the grant (at most what every entry has
-- left), and refill_after_ns, when the grant leaves fewer than min_tokens on an entry,
-- the longest wait until min_tokens could be granted again (the retry_after of
-- min_tokens on the states written; -1 = never), else 0; for a charge, granted and
-- forgiven are the units charged (the least any entry took) and forgiven, and each
-- entry is its limit's status after the charge. A charge whose id is remembered is not
-- applied again: duplicate is 1, granted and forgiven repeat its first answer, and each
-- entry is its limit's status now. A credit answers like a charge: granted is the units
-- credited (the least any entry took back; an entry that takes back nothing is not
-- written), forgiven the rest, each entry its limit's status after it; a credit whose
-- id is remembered is answered again the same way, with duplicate 1.
--
-- A charge may leave a counter up to max_debt (<= its capacity) below empty: debt and
-- counts at most double, which keeps every integer below 2^53 within the envelope. A
-- credit only lowers debt and counts.

-- shared_store::MAX_LOG_ENTRIES: the most entries a sliding log holds.
local MAX_LOG = 256

local GRACE_MS = 1000

local function fdiv(x, d)
  -- floor(x / d), exact for 0 <= x < 2^53, 0 < d < 2^53: the double quotient is off by
  -- at most one, and the products below are exact.
  local q = math.floor(x / d)
  if q * d > x then
    q = q - 1
  elseif (q + 1) * d <= x then
    q = q + 1
  end
  return q
end

local function cdiv(x, d)
  local q = fdiv(x, d)
  if q * d < x then q = q + 1 end
  return q
end

local function fmt(x)
  return string.format('%.0f', x)
end

local function parse(s)
  if not s then return nil end
  local t = {}
  for w in string.gmatch(s, '%S+') do
    local n = tonumber(w)
    if not n then return {} end
    t[#t + 1] = n
  end
  return t
end

-- ceil(1000 * x / a): nanoseconds for x scaled units to drain.
local function drain(x, a)
  local q = fdiv(x, a)
  return 1000 * q + cdiv(1000 * (x - q * a), a)
end

-- Each algorithm: (state, now_us, cost, p1..p4) ->
--   verdict, limit, remaining, reset_ns, wait_ns, new_state_or_nil, ns_until_idle

-- A bucket's debt at now (GCRA's tat - now, scaled), from its state "last debt".
local function bucket_debt(st, now, a, cap)
  if not st then return 0 end
  if not st[2] then return cap end -- undecodable: the most conservative state, as shared-store does
  local debt = st[2]
  if debt > 0 then
    local elapsed = now - st[1]
    if elapsed >= cdiv(debt, a) then debt = 0 else debt = debt - elapsed * a end
  end
  return debt
end

local function gcra(st, now, cost, a, p, units, max_wait_us, shaping)
  local cap = units * p
  local debt = bucket_debt(st, now, a, cap)
  local remaining = 0
  if cap > debt then remaining = fdiv(cap - debt, p) end
  local reset = drain(debt, a)
  if cost == 0 then return 0, units, remaining, reset, 0, nil, 0 end
  if cost > units then return 3, units, remaining, reset, 0, nil, 0 end
  local need = debt + cost * p
  if shaping then
    local delay = reset
    if need <= cap and delay <= max_wait_us * 1000 then
      local verdict = 0
      if delay > 0 then verdict = 1 end
      local until_idle = drain(need, a)
      return verdict, units, fdiv(cap - need, p), until_idle, delay, fmt(now) .. ' ' .. fmt(need), until_idle
    end
    local queue_wait = 0
    if need > cap then queue_wait = need - cap end
    local delay_wait = 0
    if max_wait_us < cdiv(debt, a) then delay_wait = debt - max_wait_us * a end
    return 2, units, remaining, reset, drain(math.max(queue_wait, delay_wait), a), nil, 0
  end
  if need <= cap then
    local until_idle = drain(need, a)
    return 0, units, fdiv(cap - need, p), until_idle, 0, fmt(now) .. ' ' .. fmt(need), until_idle
  end
  return 2, units, remaining, reset, drain(need - cap, a), nil, 0
end

local function fixed(st, now, cost, limit, wms)
  local now_ms = fdiv(now, 1000)
  local cur = fdiv(now_ms, wms)
  local index, count = cur, 0
  if st then
    if st[4] then
      if st[2] >= cur then index, count = st[2], st[3] end
    else
      index, count = cur, limit
    end
  end
  local until_end = ((index + 1) * wms - now_ms) * 1000000 - (now - now_ms * 1000) * 1000
  if until_end < 0 then until_end = 0 end
  local remaining = 0
  if limit > count then remaining = limit - count end
  local reset = 0
  if count > 0 then reset = until_end end
  if cost == 0 then return 0, limit, remaining, reset, 0, nil, 0 end
  if cost > limit then return 3, limit, remaining, reset, 0, nil, 0 end
  if count + cost <= limit then
    local state = fmt(now) .. ' ' .. fmt(index) .. ' ' .. fmt(count + cost) .. ' 0'
    return 0, limit, limit - count - cost, until_end, 0, state, until_end
  end
  return 2, limit, remaining, reset, until_end, nil, 0
end

-- A sliding window's counters at now: index, count, previous, offset (us) into window
-- index; a clock that went back is treated as the start of the stored window.
local function slide(st, now, limit, wms)
  local w = wms * 1000
  local cur = fdiv(fdiv(now, 1000), wms)
  local offset = now - cur * w
  local index, count, previous = cur, 0, 0
  if st then
    local si, sc, sp = st[2], st[3], st[4]
    if not sp then
      si, sc, sp = cur, limit, limit
    end
    if si > cur then
      index, previous, count, offset = si, sp, sc, 0
    elseif si == cur then
      index, previous, count = si, sp, sc
    elseif si + 1 == cur then
      index, previous, count = cur, sc, 0
    end
  end
  return index, count, previous, offset
end

local function sliding(st, now, cost, limit, wms)
  local w = wms * 1000 -- window in us
  local wns = w * 1000
  local index, count, previous, offset = slide(st, now, limit, wms)
  -- ns from now until window i starts, never negative
  local function until_start(i)
    local v = (i * w - now) * 1000
    if v < 0 then v = 0 end
    return v
  end
  local function reset_for(c)
    if c > 0 then return until_start(index + 2) end
    if previous > 0 then return until_start(index + 1) end
    return 0
  end
  -- weights in us (shared-store's are in ns: both sides of every comparison are 1000x)
  local used = previous * (w - offset) + count * w
  local allowance = limit * w
  local remaining = 0
  if allowance > used then remaining = fdiv(allowance - used, w) end
  if cost == 0 then return 0, limit, remaining, reset_for(count), 0, nil, 0 end
  if cost > limit then return 3, limit, remaining, reset_for(count), 0, nil, 0 end
  local spend = cost * w
  if used + spend <= allowance then
    local c = count + cost
    local state = fmt(now) .. ' ' .. fmt(index) .. ' ' .. fmt(c) .. ' ' .. fmt(previous)
    return 0, limit, fdiv(allowance - used - spend, w), reset_for(c), 0, state, until_start(index + 2)
  end
  -- min(floor(room * wns / div), wns), exactly: floor(1000 x / d) = 1000 q + floor(1000 r / d)
  local function share(room, div)
    local x = room * w
    local q = fdiv(x, div)
    if q >= w then return wns end
    local part = 1000 * q + fdiv(1000 * (x - q * div), div)
    if part > wns then part = wns end
    return part
  end
  local target = nil
  if previous > 0 and limit - count - cost >= 0 then
    local o = wns - share(limit - count - cost, previous)
    if o < wns then target = (index * w - now) * 1000 + o end
  end
  if not target then
    local o = 0
    if count > 0 then o = wns - share(limit - cost, count) end
    target = ((index + 1) * w - now) * 1000 + o
  end
  if target < 0 then target = 0 end
  return 2, limit, remaining, reset_for(count), target, nil, 0
end

-- A sliding log's live entries at now (flat: at1, cost1, at2, cost2, ...) and their sum.
local function live_log(st, now, limit, w)
  local live = {}
  local used = 0
  if st then
    if #st % 2 == 1 then
      for i = 2, #st, 2 do
        if st[i] + w > now then
          live[#live + 1] = st[i]
          live[#live + 1] = st[i + 1]
          used = used + st[i + 1]
        end
      end
    else
      live = { now, limit }
      used = limit
    end
  end
  return live, used
end

local function slog(st, now, cost, limit, wms)
  local w = wms * 1000
  local live, used = live_log(st, now, limit, w)
  local function expiry(at)
    local v = (at + w - now) * 1000
    if v < 0 then v = 0 end
    return v
  end
  local remaining = 0
  if limit > used then remaining = limit - used end
  local reset = 0
  if #live > 0 then reset = expiry(live[#live - 1]) end
  if cost == 0 then return 0, limit, remaining, reset, 0, nil, 0 end
  if cost > limit then return 3, limit, remaining, reset, 0, nil, 0 end
  if used + cost <= limit then
    local at = now
    if #live > 0 and live[#live - 1] > now then at = live[#live - 1] end
    live[#live + 1] = at
    live[#live + 1] = cost
    local parts = { fmt(now) }
    for i = 1, #live do parts[#parts + 1] = fmt(live[i]) end
    local until_idle = expiry(at)
    return 0, limit, limit - used - cost, until_idle, 0, table.concat(parts, ' '), until_idle
  end
  local excess = used + cost - limit
  local freed = 0
  local retry = -1
  for i = 1, #live, 2 do
    freed = freed + live[i + 1]
    if freed >= excess then
      retry = expiry(live[i])
      break
    end
  end
  return 2, limit, remaining, reset, retry, nil, 0
end

local function unknown(code)
  error('sluice: unknown algorithm code ' .. tostring(code))
end

local function run(code, st, now, cost, p1, p2, p3, p4)
  if code == 'tb' then return gcra(st, now, cost, p1, p2, p3, 0, false) end
  if code == 'lb' then return gcra(st, now, cost, p1, p2, p3, p4, true) end
  if code == 'fw' then return fixed(st, now, cost, p1, p2) end
  if code == 'sw' then return sliding(st, now, cost, p1, p2) end
  if code == 'sl' then return slog(st, now, cost, p1, p2) end
  return unknown(code)
end

-- The capacity: the most one request may cost, and the deepest debt a charge may leave.
local function capacity(code, p1, p3)
  if code == 'tb' or code == 'lb' then return p3 end
  if code == 'fw' or code == 'sw' or code == 'sl' then return p1 end
  return unknown(code)
end

-- Charges: (state, now_us, cost, max_debt, p1..p3) -> new state (a table in the parsed
-- form, first field now) or nil when nothing is charged, units charged, ns until idle.
-- Whole units, at most max_debt below empty (shared_store::Limit::charge).

local function charge_gcra(st, now, cost, d, a, p, units)
  local debt = bucket_debt(st, now, a, units * p)
  local ceiling = (units + d) * p
  local room = 0
  if ceiling > debt then room = fdiv(ceiling - debt, p) end
  local c = math.min(cost, room)
  if c <= 0 then return nil, 0, 0 end
  local need = debt + c * p
  return { now, need }, c, drain(need, a)
end

local function charge_fixed(st, now, cost, d, limit, wms)
  local now_ms = fdiv(now, 1000)
  local cur = fdiv(now_ms, wms)
  local index, count = cur, 0
  if st then
    if st[4] then
      if st[2] >= cur then index, count = st[2], st[3] end
    else
      index, count = cur, limit
    end
  end
  local room = limit + d - count
  local c = math.min(cost, room)
  if c <= 0 then return nil, 0, 0 end
  local until_end = ((index + 1) * wms - now_ms) * 1000000 - (now - now_ms * 1000) * 1000
  if until_end < 0 then until_end = 0 end
  return { now, index, count + c, 0 }, c, until_end
end

local function charge_sliding(st, now, cost, d, limit, wms)
  local w = wms * 1000
  local index, count, previous, offset = slide(st, now, limit, wms)
  local used = previous * (w - offset) + count * w
  local ceiling = (limit + d) * w
  local room = 0
  if ceiling > used then room = fdiv(ceiling - used, w) end
  local c = math.min(cost, room)
  if c <= 0 then return nil, 0, 0 end
  local idle = ((index + 2) * w - now) * 1000
  if idle < 0 then idle = 0 end
  return { now, index, count + c, previous }, c, idle
end

local function charge_slog(st, now, cost, d, limit, wms)
  local w = wms * 1000
  local live, used = live_log(st, now, limit, w)
  if #live / 2 >= MAX_LOG then return nil, 0, 0 end
  local c = math.min(cost, limit + d - used)
  if c <= 0 then return nil, 0, 0 end
  local at = now
  if #live > 0 and live[#live - 1] > now then at = live[#live - 1] end
  local state = { now }
  for i = 1, #live do state[#state + 1] = live[i] end
  state[#state + 1] = at
  state[#state + 1] = c
  local idle = (at + w - now) * 1000
  if idle < 0 then idle = 0 end
  return state, c, idle
end

local function charge(code, st, now, cost, d, p1, p2, p3)
  if code == 'tb' then return charge_gcra(st, now, cost, d, p1, p2, p3) end
  if code == 'fw' then return charge_fixed(st, now, cost, d, p1, p2) end
  if code == 'sw' then return charge_sliding(st, now, cost, d, p1, p2) end
  if code == 'sl' then return charge_slog(st, now, cost, d, p1, p2) end
  if code == 'lb' then return nil, 0, 0 end -- a leaky bucket is never charged
  return unknown(code)
end

-- Credits: (state, now_us, units, spent_us, p1, p2) -> new state (a table in the parsed
-- form, first field now), the units given back (at most units: fewer when the limit can
-- take back fewer) and ns until idle; nil when the credit changes nothing (a key never
-- seen, a state that does not decode, a full bucket, a window the spend does not count
-- in, a count already at zero, zero units). shared_store::Limit::credit.

-- GCRA's tat - units * per, never below now: the debt less units tokens, never below 0;
-- the tokens given back are the whole tokens missing (a partly refilled one counted).
local function credit_gcra(st, now, units, a, p, burst)
  if not st or not st[2] then return nil, 0, 0 end
  local debt = bucket_debt(st, now, a, burst * p)
  if debt <= 0 or units == 0 then return nil, 0, 0 end
  local missing = cdiv(debt, p)
  local left = 0
  -- units * p is only formed when it is below the debt (under 2^53)
  if units < missing then left = debt - units * p end
  return { now, left }, math.min(units, missing), drain(left, a)
end

-- The window a spend at spent_us counted in (shared-store: spent_at / window, in ns).
local function spent_window(spent_us, wms)
  return fdiv(fdiv(spent_us, 1000), wms)
end

-- Units fewer counted, if the spend counted in the stored window and that is now's.
local function credit_fixed(st, now, units, spent_us, wms)
  if not st or not st[4] then return nil, 0, 0 end
  local spent_in = spent_window(spent_us, wms)
  if st[2] ~= spent_in or spent_in ~= spent_window(now, wms) or st[3] == 0 or units == 0 then return nil, 0, 0 end
  local now_ms = fdiv(now, 1000)
  local until_end = ((st[2] + 1) * wms - now_ms) * 1000000 - (now - now_ms * 1000) * 1000
  if until_end < 0 then until_end = 0 end
  local back = math.min(units, st[3])
  return { now, st[2], st[3] - back, st[4] }, back, until_end
end

-- Units fewer counted in the stored window if the spend counted in it, or in the one
-- before it (previous) if the spend counted in that one; only while the spend's window
-- is now's or the one before it (the trailing window reaches no further).
local function credit_sliding(st, now, units, spent_us, wms)
  if not st or not st[4] or units == 0 then return nil, 0, 0 end
  local index, count, previous = st[2], st[3], st[4]
  local spent_in = spent_window(spent_us, wms)
  local current = spent_window(now, wms)
  local back = 0
  if spent_in ~= current and spent_in + 1 ~= current then
    return nil, 0, 0
  elseif index == spent_in and count > 0 then
    back = math.min(units, count)
    count = count - back
  elseif index == spent_in + 1 and previous > 0 then
    back = math.min(units, previous)
    previous = previous - back
  else
    return nil, 0, 0
  end
  local idle = ((index + 2) * wms * 1000 - now) * 1000
  if idle < 0 then idle = 0 end
  return { now, index, count, previous }, back, idle
end

local function credit(code, st, now, units, spent_us, p1, p2, p3)
  if code == 'tb' then return credit_gcra(st, now, units, p1, p2, p3) end
  if code == 'fw' then return credit_fixed(st, now, units, spent_us, p2) end
  if code == 'sw' then return credit_sliding(st, now, units, spent_us, p2) end
  if code == 'lb' or code == 'sl' then return nil, 0, 0 end -- never credited
  return unknown(code)
end

-- shared_store::Limit::status: a query, whose verdict is the rejection of one unit
-- (with its exact wait) when nothing is left.
local function status(code, st, now, p1, p2, p3, p4)
  local v, limit, remaining, reset, wait = run(code, st, now, 0, p1, p2, p3, p4)
  if remaining == 0 then
    local v1, _, _, _, wait1 = run(code, st, now, 1, p1, p2, p3, p4)
    if v1 == 2 then v, wait = v1, wait1 end
  end
  return v, limit, remaining, reset, wait
end

-- shared_store::Limit::owed: the whole units a state counts beyond its capacity at now.
local function owed(code, st, now, p1, p2, p3)
  if #st == 0 then return 0 end
  if code == 'tb' then
    return math.max(cdiv(bucket_debt(st, now, p1, p3 * p2), p2) - p3, 0)
  end
  if code == 'fw' then
    if st[4] and st[2] == fdiv(fdiv(now, 1000), p2) then return math.max(st[3] - p1, 0) end
    return 0
  end
  if code == 'sw' then
    if not st[4] then return 0 end
    local _, count, previous, offset = slide(st, now, p1, p2)
    local w = p2 * 1000
    return math.max(cdiv(previous * (w - offset) + count * w, w) - p1, 0)
  end
  if code == 'sl' then
    if #st % 2 == 0 then return 0 end
    local _, used = live_log(st, now, p1, p2 * 1000)
    return math.max(used - p1, 0)
  end
  if code == 'lb' then return 0 end
  return unknown(code)
end

-- shared_store::Limit::exhausted at now, in the parsed form, owing up to owe more units
-- (at most the capacity); and the units it owes.
local function exhausted(code, now, p1, p2, p3, owe)
  local kept = math.min(owe or 0, capacity(code, p1, p3))
  if code == 'tb' or code == 'lb' then return { now, (p3 + kept) * p2 }, kept end
  if code == 'fw' or code == 'sw' then return { now, fdiv(fdiv(now, 1000), p2), p1 + kept, p1 }, kept end
  return { now, now, p1 + kept }, kept
end

-- shared_store::Limit::carry: the state st, decided under the limit named osig, as the
-- state of the limit (code, p1..p3) at now, and the units of debt it could not keep.
local function adopt(code, p1, p2, p3, osig, st, now)
  local o = {}
  for w in string.gmatch(osig, '[^.]+') do o[#o + 1] = w end
  local o1, o2, o3 = tonumber(o[2]), tonumber(o[3]), tonumber(o[4])
  if not (o1 and o2 and o3) or #st == 0 then return exhausted(code, now, p1, p2, p3, 0), 0 end
  if o[1] ~= code then
    -- another algorithm: exhausted, still owing what the old state owed
    local debt = owed(o[1], st, now, o1, o2, o3)
    local state, kept = exhausted(code, now, p1, p2, p3, debt)
    return state, debt - kept
  end
  if code == 'tb' or code == 'lb' then
    -- whole units spent, rounded up; those available (negative in debt) are kept, at
    -- most the new capacity above empty and below it
    local spent = cdiv(bucket_debt(st, now, o1, o3 * o2), o2) + p3 - o3
    local forgiven = 0
    if spent < 0 then spent = 0 end
    if spent > 2 * p3 then spent, forgiven = 2 * p3, spent - 2 * p3 end
    return { now, spent * p2 }, forgiven
  end
  if code == 'fw' then
    if not st[4] then return exhausted(code, now, p1, p2, p3, 0), 0 end
    local index, count = st[2], st[3]
    local cur = fdiv(fdiv(now, 1000), o2)
    if index < cur then index, count = cur, 0 end
    if p2 ~= o2 then index = fdiv(fdiv(now, 1000), p2) end
    local forgiven = math.max(count - 2 * p1, 0)
    return { st[1], index, count - forgiven, 0 }, forgiven
  end
  if code == 'sw' then
    if not st[4] then return exhausted(code, now, p1, p2, p3, 0), 0 end
    local index, count, previous = slide(st, now, o1, o2)
    if p2 ~= o2 then index = fdiv(fdiv(now, 1000), p2) end
    local over_count, over_previous = math.max(count - 2 * p1, 0), math.max(previous - 2 * p1, 0)
    return { st[1], index, count - over_count, previous - over_previous }, over_count + over_previous
  end
  if code == 'sl' then return st, 0 end -- a sliding log keeps its entries
  return unknown(code)
end

-- A stored state: its signature and its numbers (nil, nil for a key never seen; an
-- empty table for one that does not decode, which every algorithm reads as exhausted).
local function parse_state(s)
  if not s then return nil, nil end
  local sig, rest = string.match(s, '^(%a%a[%d.]*) (.*)$')
  if not sig then return '', {} end
  return sig, parse(rest)
end

local function serialize(t)
  local parts = {}
  for i = 1, #t do parts[i] = fmt(t[i]) end
  return table.concat(parts, ' ')
end

local real_now
local override = ARGV[1]
if override ~= '' then
  real_now = tonumber(override)
else
  local t = redis.call('TIME')
  real_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local op = ARGV[2]
local tokens = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local remembers = op == 'charge' or op == 'credit'
local seen = nil
if remembers and KEYS[n + 1] then seen = parse(redis.call('GET', KEYS[n + 1])) end

local reply = { 0, 0, 1, 0, 0, 0, 0, 0 }
reply[1] = fdiv(real_now, 1000000)
reply[2] = real_now - reply[1] * 1000000

-- How long a key written at now may live: until it is idle (plus the clock step we
-- clamped over, plus a grace second), at most until its entry expires (a clamp's counter
-- ends with its override); with a test time override, keep keys for ten minutes of real
-- time unless they expire.
local function ttl_of(idle_ns, now, expires)
  local ttl = cdiv(idle_ns, 1000000) + cdiv(now - real_now, 1000) + GRACE_MS
  if override ~= '' and ttl < 600000 then ttl = 600000 end
  if expires > 0 then ttl = math.max(math.min(ttl, cdiv(expires - real_now, 1000)), 1) end
  return ttl
end

-- Every entry: its numbers, its state at its own time (time never runs backwards for a
-- key), carried over to the request's limit when it was decided under another.
local entries = {}
local carried = {}
for i = 1, n do
  local base = 5 + 7 * (i - 1)
  local e = {
    key = KEYS[i],
    code = ARGV[base],
    p1 = tonumber(ARGV[base + 1]), p2 = tonumber(ARGV[base + 2]),
    p3 = tonumber(ARGV[base + 3]), p4 = tonumber(ARGV[base + 4]),
    cost = tonumber(ARGV[base + 5]),
    expires = tonumber(ARGV[base + 6]),
  }
  e.sig = e.code .. '.' .. ARGV[base + 1] .. '.' .. ARGV[base + 2] .. '.' .. ARGV[base + 3] .. '.' .. ARGV[base + 4]
  local osig, st = parse_state(redis.call('GET', e.key))
  e.now = real_now
  if st and st[1] and st[1] > e.now then e.now = st[1] end
  if st and osig ~= e.sig then
    local forgiven
    st, forgiven = adopt(e.code, e.p1, e.p2, e.p3, osig, st, e.now)
    reply[8] = reply[8] + forgiven
    st[1] = e.now -- the time it was carried over at, as the key's latest (`last` in memory)
    -- kept whatever the decision (MemoryCounters::carry_over): a key rejected under new
    -- numbers refills at the new rate from now, not again from its old state
    local _, _, _, until_full = run(e.code, st, e.now, 0, e.p1, e.p2, e.p3, e.p4)
    local ttl = ttl_of(until_full, e.now, e.expires)
    local left = redis.call('PTTL', e.key)
    if left > ttl and e.expires == 0 then ttl = left end
    carried[i] = { e.key, e.sig .. ' ' .. serialize(st), ttl }
  end
  e.st = st
  entries[i] = e
end

local function decide(e, cost)
  return run(e.code, e.st, e.now, cost, e.p1, e.p2, e.p3, e.p4)
end

local writes = {}
local admitted = true
local granted = 0
local forgiven = 0
local answers = {}

if op == 'lease' then
  -- A window that ends within a millisecond of the reply's time grants nothing: the
  -- rejection waits until it ends (lease_life in the service's store.rs).
  local closing = nil
  local left = tokens
  local min_tokens = 0
  for _, e in ipairs(entries) do
    if e.code == 'fw' or e.code == 'sw' then
      local until_end = (fdiv(fdiv(real_now, 1000), e.p2) + 1) * e.p2 * 1000 - real_now
      if until_end < 1000 and (not closing or until_end * 1000 > closing) then closing = until_end * 1000 end
    end
    local _, _, remaining = decide(e, 0)
    left = math.min(left, remaining)
    min_tokens = e.cost
  end
  -- min(tokens, what every entry has left) when that reaches min_tokens (every entry's
  -- cost), else the rejection of min_tokens units (decide_lease in the service's store.rs)
  local g = left
  if g < min_tokens then g = 0 end
  local all = true
  for i, e in ipairs(entries) do
    local v, limit, remaining, reset, wait, state, idle
    if closing then
      v, limit, remaining, reset = decide(e, 0)
      v, wait = 2, closing
      all = false
    else
      v, limit, remaining, reset, wait, state, idle = decide(e, math.max(g, e.cost, 1))
      if g > 0 and v <= 1 and state then
        writes[#writes + 1] = { e.key, e.sig .. ' ' .. state, ttl_of(idle, e.now, e.expires), i }
        -- Fewer than min_tokens left: when that many are back, decided on the state
        -- about to be written (decide_lease's refill_after): the longest over entries.
        if remaining < e.cost then
          local rv, _, _, _, rwait = run(e.code, parse(state), e.now, e.cost, e.p1, e.p2, e.p3, e.p4)
          if rv == 2 and reply[7] >= 0 and (rwait < 0 or rwait > reply[7]) then reply[7] = rwait end
        end
      else
        all = false
      end
    end
    answers[i] = { v, limit, remaining, reset, wait }
  end
  if all and g > 0 then granted = g else reply[7] = 0 end
  admitted = granted > 0
elseif remembers and seen then
  granted, forgiven = seen[1] or 0, seen[2] or 0
  reply[5] = 1
  for i, e in ipairs(entries) do
    answers[i] = { status(e.code, e.st, e.now, e.p1, e.p2, e.p3, e.p4) }
  end
elseif remembers then
  -- What each entry took: a charge some of the cost (its own max_debt bounds it), a
  -- credit what the entry can take back; the answer is the least any entry took.
  granted = nil
  for i, e in ipairs(entries) do
    local moved_st, moved, moved_idle
    if op == 'charge' then
      local d = math.min(tokens, capacity(e.code, e.p1, e.p3))
      moved_st, moved, moved_idle = charge(e.code, e.st, e.now, e.cost, d, e.p1, e.p2, e.p3)
    else
      moved_st, moved, moved_idle = credit(e.code, e.st, e.now, e.cost, tokens, e.p1, e.p2, e.p3)
    end
    local after = e.st
    if moved_st and moved > 0 then
      after = moved_st
      writes[#writes + 1] = { e.key, e.sig .. ' ' .. serialize(moved_st), ttl_of(moved_idle, e.now, e.expires), i }
    else
      moved = 0
    end
    if not granted or moved < granted then granted = moved end
    answers[i] = { status(e.code, after, e.now, e.p1, e.p2, e.p3, e.p4) }
  end
  granted = granted or 0
  if granted > entries[1].cost then granted = entries[1].cost end
  forgiven = entries[1].cost - granted
else
  for i, e in ipairs(entries) do
    local v, limit, remaining, reset, wait, state, idle = decide(e, e.cost)
    if v > 1 then admitted = false end
    if state then writes[#writes + 1] = { e.key, e.sig .. ' ' .. state, ttl_of(idle, e.now, e.expires), i } end
    answers[i] = { v, limit, remaining, reset, wait }
  end
end

if op == 'lease' or remembers then
  reply[4] = granted
  -- a charge or a credit writes what each entry took, whatever the others took
  if remembers then admitted = true end
end
if remembers then
  reply[6] = forgiven
  if KEYS[n + 1] and not seen then
    redis.call('SET', KEYS[n + 1], fmt(granted) .. ' ' .. fmt(forgiven), 'PX', ARGV[5 + 7 * n])
  end
end
if admitted then
  for _, w in ipairs(writes) do
    redis.call('SET', w[1], w[2], 'PX', fmt(w[3]))
    carried[w[4]] = nil
  end
else
  reply[3] = 0
end
for _, c in pairs(carried) do
  redis.call('SET', c[1], c[2], 'PX', fmt(c[3]))
end
for i = 1, n do
  local a = answers[i]
  for j = 1, 5 do reply[#reply + 1] = a[j] end
end
return reply
