#!/usr/bin/env python3
"""Discrete-time simulation of plexsphere's RLQS allocator policy (server) against Envoy's
rate_limit_quota filter (client, as Envoy's source has it: docs/adr/0041).

Why this exists: an RLQS server never sees a request; every Envoy decides alone from the token
bucket it was last assigned. The policy below must keep the sum of all Envoys' admissions within
what one exact bucket (GCRA, rate R, burst B) would admit in any window -- B + R*w -- while shares
follow demand. This script measures that, and the cost of it, so the ADR can pick the parameters.

Model (all integer arithmetic, time in ticks of 1 ms; every admission happens at a tick instant):
  * Envoy: one bucket per Envoy; continuous-fill token bucket (max_tokens M, fill q per F s),
    one token a request; no_assignment_behavior = DENY_ALL (so the first request is denied and
    triggers an immediate report); reports every 5 s on a timer with a random phase; TTL in whole
    seconds; an equal assignment keeps the bucket and its tokens; a different token bucket starts
    with floor(M_new * remaining / M_old) tokens; after DENY_ALL, expiry or nothing, it starts full.
    A stream break keeps the cached assignment until its TTL; the next timer tick opens a new
    stream (a new holder for the server) and reports.
  * Server: the pool / counted-share policy of the brief (see Server.on_report).
  * Checker: exact maximum, over ALL windows [i, j] of the admission trace, of
      admitted(i..j) - (B + R*(j-i)*dt); > 0 is an over-admission. (O(n) running-minimum form of
      the double loop; cross-checked against the literal double loop by --selftest.)
  * Reference: one GCRA bucket (rate R, burst B) fed the same aggregate arrivals, deciding each
    request; under-admission = 1 - policy_admitted / exact_admitted over the same 120 s.

Usage:  python3 bench/rlqs_policy.py [--part scenarios|sweep|adversarial|selftest|all-fast]
Each part runs in well under 60 s on one core.
"""
import argparse
import heapq
import math
import random
import sys
import time

TPS = 1000            # ticks per second
INF = float("inf")
REPORT_S = 5          # Envoy's hard-coded report interval


class P:
    """Policy + environment parameters."""

    def __init__(self, **kw):
        self.R = 1000            # tokens/s (integer)
        self.B = 1000            # tokens (integer)
        self.reserve = 0.01
        self.headroom = 1.25
        self.hr_mode = "mult"    # "mult": water-fill demand*headroom (as specified);
                                 # "spare": water-fill demand, headroom only from what is left
        self.burst_frac = 0.5
        self.ttl = 12            # whole seconds
        self.F = 1               # fill interval, whole seconds
        self.max_rtt = 0.5       # seconds
        self.delay = "rtt"       # "rtt": down+up <= max_rtt; "oneway": each direction <= max_rtt
        self.on_close = "keep"   # "keep": a closed holder stays counted until expiry; "drop": naive
        self.accrual = "exact"   # "exact": accrue at every counted change; "lazy": only at reports
        self.snap = False        # demand over the gap snapped to a multiple of 5 s
        self.margin = 1.0        # hr_mode "spare": first pass fills demand*margin
        self.seed = 1
        self.__dict__.update(kw)

    def copy(self, **kw):
        q = P()
        q.__dict__.update(self.__dict__)
        q.__dict__.update(kw)
        return q


class Share:
    __slots__ = ("q", "M", "sent", "exp", "deny")

    def __init__(self, q, M, sent, exp, deny):
        self.q, self.M, self.sent, self.exp, self.deny = q, M, sent, exp, deny


class Holder:
    def __init__(self, hid, envoy, now):
        self.id = hid
        self.envoy = envoy
        self.alive = True
        self.demand = INF
        self.first = True
        self.last_report = now
        self.cur = None        # last Share sent
        self.pend = []         # older Shares still counted
        self.last_sent = None

    def counted(self):
        q = M = 0
        for s in ([self.cur] if self.cur else []) + self.pend:
            if not s.deny:
                if s.q > q:
                    q = s.q
                if s.M > M:
                    M = s.M
        return q, M


class Server:
    def __init__(self, p, sim):
        self.p = p
        self.sim = sim
        self.R = p.R
        self.B = p.B
        self.S = p.F * TPS                 # pool scale: tokens * S
        self.pool = p.B * self.S
        self.last_acc = 0
        self.holders = {}
        self.rtt = int(round(p.max_rtt * TPS))
        self.ttl_t = p.ttl * TPS
        self.silent = 2 * REPORT_S * TPS + self.rtt   # no report for this long: the stream is gone
        self.sends = 0
        self.denies = 0
        self.min_pool = self.pool

    # ---- accounting -------------------------------------------------------------------------
    def sums(self, skip=None):
        sq = sM = 0
        for h in self.holders.values():
            if h.id == skip:
                continue
            q, M = h.counted()
            sq += q
            sM += M
        return sq, sM

    def accrue(self, t):
        if t <= self.last_acc:
            return
        sq, sM = self.sums()
        self.pool = min(self.pool + (self.R * self.p.F - sq) * (t - self.last_acc),
                        (self.B - sM) * self.S)
        self.last_acc = t

    def expire(self, t):
        """Drop shares whose expiry is <= t; returns True if any was dropped."""
        dropped = False
        for h in list(self.holders.values()):
            if h.cur and h.cur.exp <= t:
                h.cur = None
                dropped = True
            n = len(h.pend)
            h.pend = [s for s in h.pend if s.exp > t]
            dropped |= len(h.pend) != n
            if h.cur is None and not h.pend and (not h.alive or t - h.last_report > self.silent):
                del self.holders[h.id]
        return dropped

    def advance(self, now):
        if self.p.accrual == "exact":
            while True:
                nxt = None
                for h in self.holders.values():
                    for s in ([h.cur] if h.cur else []) + h.pend:
                        if s.exp <= now and (nxt is None or s.exp < nxt):
                            nxt = s.exp
                if nxt is None:
                    break
                self.accrue(nxt)
                self.expire(nxt)
            self.accrue(now)
        else:  # lazy: expire first, then accrue the whole gap at the new (lower) sums
            self.expire(now)
            self.accrue(now)
        if self.pool < self.min_pool:
            self.min_pool = self.pool

    def set_rule(self, now, R, B):
        self.advance(now)
        self.R, self.B = R, B
        sq, sM = self.sums()
        self.pool = min(self.pool, (B - sM) * self.S)

    # ---- streams ----------------------------------------------------------------------------
    def open(self, envoy, now):
        hid = self.sim.next_holder_id()
        self.holders[hid] = Holder(hid, envoy, now)
        return hid

    def close(self, hid, now):
        h = self.holders.get(hid)
        if h is None:
            return
        self.advance(now)
        if self.p.on_close == "drop":
            del self.holders[hid]
        else:
            h.alive = False

    # ---- the policy -------------------------------------------------------------------------
    def targets(self, cap):
        now = self.last_acc
        hs = [h for h in self.holders.values() if h.alive and now - h.last_report <= self.silent]
        hr = self.p.headroom
        if self.p.hr_mode == "mult":
            return waterfill(cap, {h.id: h.demand * hr for h in hs})
        first = waterfill(cap, {h.id: h.demand * self.p.margin for h in hs})
        left = cap - sum(first.values())
        extra = waterfill(left, {h.id: max(0.0, h.demand * hr - first[h.id]) for h in hs})
        return {i: first[i] + extra[i] for i in first}

    def on_report(self, hid, allowed, denied, now):
        h = self.holders.get(hid)
        if h is None or not h.alive:
            return
        p = self.p
        # (1) pool accrues with the counted sums as they stood
        self.advance(now)
        if h.first:
            h.demand = INF
            h.first = False
        else:
            dt = max(1, now - h.last_report)
            if p.snap:   # Envoy's timer is exactly 5 s: undo the network jitter in the gap
                k = round(dt / (REPORT_S * TPS))
                if k >= 1 and abs(dt - k * REPORT_S * TPS) <= self.rtt:
                    dt = k * REPORT_S * TPS
            h.demand = (allowed + denied) * TPS / dt
        h.last_report = now
        # (2) a report > max_rtt after the last send proves the current assignment is in use
        if h.last_sent is None or now - h.last_sent > self.rtt:
            h.pend = []
        else:
            return  # crossed the send: nothing new this time
        # (3) targets
        rcap = self.R * (1 - p.reserve)
        tgt = self.targets(rcap).get(h.id, 0.0)
        # (4) grant
        oq, oM = self.sums(skip=h.id)
        g = min(tgt, rcap - oq / p.F)
        q = max(0, int(math.floor(g * p.F + 1e-9)))
        # (5) burst
        Mt = max(1, int(math.floor(p.burst_frac * self.B * max(g, 0) / rcap + 1e-9)))
        cur = h.cur
        full = (cur is None or cur.deny or cur.sent + self.ttl_t < now + self.rtt)
        Mcur = 0 if full else cur.M
        Mn = min(Mt, self.B - oM)
        charge = Mn if full else max(0, Mn - Mcur)
        avail = self.pool // self.S       # whole tokens the pool can pay
        if charge > avail:
            Mn = max(0, avail) if full else Mcur + max(0, avail)
            charge = Mn if full else max(0, Mn - Mcur)
        deny = q == 0 or Mn < 1
        if deny:
            charge = 0
            q, Mn = 0, 0
            self.denies += 1
        self.pool -= charge * self.S
        # (6) counted = max(cur, new) until cur can no longer be used
        if cur is not None:
            h.pend = [cur]
        h.cur = Share(q, Mn, now, now + self.ttl_t + self.rtt, deny)
        h.last_sent = now
        self.sends += 1
        # (7) delivery
        self.sim.deliver(h.envoy, hid, h.cur, now)


def waterfill(cap, wants):
    res = {}
    ids = sorted(wants, key=lambda i: wants[i])
    rem = max(0.0, cap)
    n = len(ids)
    for k, i in enumerate(ids):
        g = min(wants[i], rem / (n - k))
        res[i] = g
        rem -= g
    return res


class Envoy:
    def __init__(self, sim, idx, p, demand, phase):
        self.sim, self.idx, self.p = sim, idx, p
        self.S = p.F * TPS
        self.demand = demand      # list of (start_tick, rate/s, poisson) sorted
        self.di = 0
        self.acc = 0
        self.phase = phase        # report timer phase (ticks)
        self.created = False
        self.action = None        # None (no assignment: DENY_ALL), "DENY", "TB"
        self.M = self.q = 0
        self.tok = 0
        self.last = 0
        self.exp = None
        self.allowed = self.denied = 0
        self.stream = None        # holder id of the live stream
        self.adm_bins = None
        self.rx_log = []          # (tick, q, M, deny)
        self.gone = False         # process gone (bucket gone with it)
        self.burst_hook = None

    def rate_at(self, t):
        d = self.demand
        while self.di + 1 < len(d) and d[self.di + 1][0] <= t:
            self.di += 1
        return d[self.di]

    def arrivals(self, t):
        if self.gone:
            return 0
        if self.burst_hook:
            return self.burst_hook(self, t)
        _, r, pois = self.rate_at(t)
        if r <= 0:
            return 0
        if pois:
            lam = r / TPS
            L = math.exp(-lam)
            k, x = 0, self.sim.rng.random()
            while x > L:
                k += 1
                x *= self.sim.rng.random()
            return k
        self.acc += r
        n = int(self.acc // TPS)
        self.acc -= n * TPS
        return n

    def ensure_stream(self, t):
        if self.stream is None:
            self.stream = self.sim.server.open(self, t)

    def decide(self, t, n):
        if self.exp is not None and t >= self.exp:
            self.action, self.exp = None, None
        adm = 0
        if not self.created:
            self.created = True
            self.denied += 1          # no_assignment_behavior DENY_ALL
            n -= 1
            self.ensure_stream(t)
            self.report(t)            # immediate report of that one bucket
        if n > 0:
            if self.action == "TB":
                tok = self.tok + self.q * (t - self.last)
                cap = self.M * self.S
                if tok > cap:
                    tok = cap
                self.last = t
                k = tok // self.S
                if k > n:
                    k = n
                self.tok = tok - k * self.S
                adm = k
                self.allowed += k
                self.denied += n - k
            else:
                self.denied += n
        return adm

    def report(self, t):
        if not self.created or self.gone:
            return
        self.ensure_stream(t)
        a, d = self.allowed, self.denied
        self.allowed = self.denied = 0
        self.sim.send_report(self, self.stream, a, d, t)

    def timer(self, t):
        self.report(t)
        self.sim.at(t + REPORT_S * TPS, self.timer)

    def receive(self, hid, sh, t):
        if hid != self.stream or self.gone:
            return  # stream gone: message lost
        if self.exp is not None and t >= self.exp:
            self.action, self.exp = None, None
        self.rx_log.append((t, sh.q, sh.M, sh.deny))
        if sh.deny:
            self.action = "DENY"
            self.tok = 0
        else:
            if self.action == "TB":
                if sh.M == self.M and sh.q == self.q:
                    pass                       # equal: keep bucket and tokens
                else:
                    tok = min(self.M * self.S, self.tok + self.q * (t - self.last))
                    self.tok = (sh.M * tok // (self.M * self.S)) * self.S
            else:
                self.tok = sh.M * self.S       # no bucket before: starts full
            self.action = "TB"
            self.M, self.q = sh.M, sh.q
            self.last = t
        self.exp = t + self.p.ttl * TPS
        self.sim.last_rx[self.idx] = t

    def break_stream(self, t, server_sees):
        """The stream dies without goodbye. The Envoy keeps its cached assignment until TTL and
        opens a new stream (a new holder) at its next timer tick. If the server sees the close,
        Server.close applies on_close; if not, the old holder just falls silent."""
        if self.stream is None:
            return
        if server_sees:
            self.sim.server.close(self.stream, t)
        self.stream = None


class Sim:
    def __init__(self, p, envoy_specs, T, rule_changes=(), events=()):
        self.p = p
        self.rng = random.Random(p.seed)
        self.T = T
        self.heap = []
        self.seq = 0
        self.hid = 0
        self.server = Server(p, self)
        self.envoys = []
        self.last_rx = {}
        self.fifo = {}
        for i, spec in enumerate(envoy_specs):
            e = Envoy(self, i, p, spec, self.rng.randrange(REPORT_S * TPS))
            e.adm_bins = [0] * (T // TPS + 2)
            self.envoys.append(e)
            self.at(e.phase, e.timer)
        self.rule_changes = dict(rule_changes)
        for t, fn in events:
            self.at(t, fn)
        self.trace = []
        self.ref = []
        self.arr = []

    def next_holder_id(self):
        self.hid += 1
        return self.hid

    def at(self, t, fn, *args):
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, fn, args))

    def delays(self):
        rtt = self.server.rtt
        if self.p.delay == "rtt":
            down = self.rng.randint(1, max(1, int(rtt * 0.6)))
            up = self.rng.randint(1, max(1, rtt - down))
        elif self.p.delay == "oneway":  # each one-way delay <= max_rtt, adversarially long
            down = rtt
            up = self.rng.randint(1, rtt)
        else:  # "stall": 5% of assignments are delivered late (2-7 s), beyond max_rtt
            down = self.rng.randint(1, int(rtt * 0.6))
            if self.rng.random() < 0.05:
                down = self.rng.randint(2 * TPS, 7 * TPS)
            up = self.rng.randint(1, max(1, rtt - int(rtt * 0.6)))
        return down, up

    def _fifo(self, key, t):
        t = max(t, self.fifo.get(key, 0))
        self.fifo[key] = t
        return t

    def send_report(self, envoy, hid, a, d, t):
        _, up = self.delays()
        self.at(self._fifo((hid, "up"), t + up), self.server.on_report, hid, a, d)

    def deliver(self, envoy, hid, sh, t):
        down, _ = self.delays()
        self.at(self._fifo((hid, "down"), t + down), envoy.receive, hid, sh)

    def run(self):
        heap = self.heap
        envoys = self.envoys
        R, B = self.p.R, self.p.B
        ref_tok = B * TPS
        trace, ref, arrs = self.trace, self.ref, self.arr
        for t in range(self.T):
            if t in self.rule_changes:
                R, B = self.rule_changes[t]
                self.server.set_rule(t, R, B)
                ref_tok = min(ref_tok, B * TPS)
            while heap and heap[0][0] <= t:
                _, _, fn, args = heapq.heappop(heap)
                fn(*args, t)
            tot = 0
            narr = 0
            b = t // TPS
            for e in envoys:
                n = e.arrivals(t)
                if n:
                    narr += n
                    k = e.decide(t, n)
                    if k:
                        tot += k
                        e.adm_bins[b] += k
            trace.append(tot)
            arrs.append(narr)
            # exact one-at-a-time reference (GCRA == token bucket, rate R, burst B)
            ref_tok = min(B * TPS, ref_tok + R)
            k = min(narr, ref_tok // TPS)
            ref_tok -= k * TPS
            ref.append(k)
        return self


# ---- window checker ---------------------------------------------------------------------------
def max_excess(trace, R, B, start=0, end=None):
    """max over start<=i<=j<end of sum(trace[i..j]) - B - R*(j-i)/TPS, in tokens, with the window."""
    end = len(trace) if end is None else end
    best = -INF
    best_w = None
    s = 0                      # TPS * prefix sum up to i (exclusive)
    minv = INF
    mini = start
    for j in range(start, end):
        v = s - R * j          # value for window start i=j
        if v < minv:
            minv, mini = v, j
        s += TPS * trace[j]
        cand = s - R * j - minv
        if cand > best:
            best, best_w = cand, (mini, j)
    return (best - TPS * B) / TPS, best_w


def max_excess_brute(trace, R, B):
    best = -INF
    for i in range(len(trace)):
        s = 0
        for j in range(i, len(trace)):
            s += trace[j]
            x = s - B - R * (j - i) / TPS
            if x > best:
                best = x
    return best


def compliance_after(trace, R, B, c):
    """Earliest tick T >= c such that every window starting at >= T satisfies B + R*w."""
    n = len(trace)
    pre = [0] * (n + 1)
    for i in range(n):
        pre[i + 1] = pre[i] + trace[i]
    # f(j) = TPS*pre[j+1] - R*j ; excess(i) = max_{j>=i} f(j) - (TPS*pre[i] - R*i) - TPS*B
    suf = -INF
    last_bad = None
    for i in range(n - 1, c - 1, -1):
        f = TPS * pre[i + 1] - R * i
        if f > suf:
            suf = f
        if suf - (TPS * pre[i] - R * i) - TPS * B > 0 and last_bad is None:
            last_bad = i
    return c if last_bad is None else last_bad + 1


# ---- scenarios --------------------------------------------------------------------------------
def sat(rate=1000, start=0):
    return [(0, 0, False), (start, rate, False)]


def settle_time(e_bins, fair, t0, t1, tol=0.10):
    """first second s in [t0,t1) after which every listed Envoy's per-second admissions stay within tol of fair."""
    s = t1
    for sec in range(t1 - 1, t0 - 1, -1):
        if all(abs(b[sec] - f) <= tol * f for b, f in zip(e_bins, fair)):
            s = sec
        else:
            break
    return s


def under(sim, t0, t1):
    a = sum(sim.trace[t0 * TPS:t1 * TPS])
    r = sum(sim.ref[t0 * TPS:t1 * TPS])
    return 1 - a / r if r else 0.0, a, r


WARM, MEAS = 10, 120


def s1_equal(p, B=None, poisson_total=None):
    p = p.copy(B=B or p.B)
    T = (WARM + MEAS) * TPS
    if poisson_total:
        specs = [[(0, poisson_total / 3, True)] for _ in range(3)]
    else:
        specs = [[(0, 0, False), (p_rand(p, i), 1000, False)] for i in range(3)]
    sim = Sim(p, specs, T).run()
    u, a, r = under(sim, WARM, WARM + MEAS)
    fair = p.R * (1 - p.reserve) / 3
    st = settle_time([e.adm_bins for e in sim.envoys], [fair] * 3, 0, WARM + MEAS)
    ex, w = max_excess(sim.trace, p.R, p.B)
    return dict(under=u, adm=a, ref=r, settle=st, excess=ex, win=w, sim=sim)


def p_rand(p, i):
    return random.Random(p.seed * 31 + i).randrange(500)


def s2_unequal(p):
    T = (WARM + MEAS) * TPS
    specs = [[(0, 0, False), (p_rand(p, 0), 100, False)],
             [(0, 0, False), (p_rand(p, 1), 300, False)],
             [(0, 0, False), (p_rand(p, 2), 2000, False)]]
    sim = Sim(p, specs, T).run()
    u, a, r = under(sim, WARM, WARM + MEAS)
    bins = [e.adm_bins for e in sim.envoys]
    rates = [sum(b[WARM:WARM + MEAS]) / MEAS for b in bins]
    st = settle_time(bins, [100, 300, 600], 0, WARM + MEAS)
    ex, w = max_excess(sim.trace, p.R, p.B)
    return dict(under=u, rates=rates, settle=st, excess=ex, sim=sim)


def s2_poisson(p):
    T = (WARM + MEAS) * TPS
    specs = [[(0, 100, True)], [(0, 300, True)], [(0, 2000, False)]]
    sim = Sim(p, specs, T).run()
    u, a, r = under(sim, WARM, WARM + MEAS)
    rates = [sum(e.adm_bins[WARM:WARM + MEAS]) / MEAS for e in sim.envoys]
    return dict(under=u, rates=rates, excess=max_excess(sim.trace, p.R, p.B)[0], sim=sim)


def s3_idle_newcomer(p):
    """3 saturating Envoys; E0 idles at 30 s and returns at 60 s; a 4th Envoy joins at 95 s."""
    T = 130 * TPS
    t_idle, t_back, t_new = 30 * TPS, 60 * TPS, 95 * TPS
    specs = [[(0, 0, False), (p_rand(p, 0), 1000, False), (t_idle, 0, False), (t_back, 1000, False)],
             [(0, 0, False), (p_rand(p, 1), 1000, False)],
             [(0, 0, False), (p_rand(p, 2), 1000, False)],
             [(0, 0, False), (t_new, 1000, False)]]
    sim = Sim(p, specs, T)
    released = []

    def probe(t):
        e0 = sim.envoys[0]
        h = sim.server.holders.get(e0.stream)
        if t > t_idle and not released and h is not None and h.counted()[0] == 0:
            released.append(t)
        sim.at(t + 100, probe)
    sim.at(t_idle, probe)
    sim.run()
    b = [e.adm_bins for e in sim.envoys]
    rcap = p.R * (1 - p.reserve)
    sec = lambda lo, hi, ok: next((s - lo for s in range(lo, hi) if ok(s)), None)
    return dict(
        release=None if not released else (released[0] - t_idle) / TPS,
        give=sec(30, 60, lambda s: b[1][s] + b[2][s] >= 0.9 * rcap),
        back_first=sec(60, 95, lambda s: b[0][s] > 0),
        back=sec(60, 95, lambda s: b[0][s] >= 0.9 * rcap / 3),
        new_first=sec(95, 130, lambda s: b[3][s] > 0),
        new=sec(95, 130, lambda s: b[3][s] >= 0.9 * rcap / 4),
        excess=max_excess(sim.trace, p.R, p.B)[0], sim=sim)


def s4_lowered(p, R2=200):
    T = 80 * TPS
    c = 40 * TPS
    specs = [[(0, 0, False), (p_rand(p, i), 1000, False)] for i in range(3)]
    sim = Sim(p, specs, T, rule_changes=[(c, (R2, p.B))])
    # what the assignments in force at the change could still admit: tokens held + rate until replaced
    snap = {}

    def take_snap(t):
        for e in sim.envoys:
            tok = 0
            if e.action == "TB":
                tok = min(e.M * e.S, e.tok + e.q * (t - e.last)) / e.S
            snap[e.idx] = (e.action, e.q, e.M, tok, len(e.rx_log))
    sim.at(c, take_snap)
    sim.run()
    allow = 0.0
    repl = []
    for e in sim.envoys:
        act, q, M, tok, nrx = snap[e.idx]
        later = [x for x in e.rx_log[nrx:] if x[0] >= c]
        # old assignment is in force until the first assignment received after the change
        # that was computed after it (the first one received at >= c + max_rtt is surely such)
        tend = next((x[0] for x in later), T)
        if act == "TB":
            allow += tok + q / p.F * (tend - c) / TPS
        repl.append((tend - c) / TPS)
    ex_new, w = max_excess(sim.trace, R2, p.B, start=c)
    comp = compliance_after(sim.trace, R2, p.B, c)
    # over-admission beyond new bound + old allowance
    adm_after = sum(sim.trace[c:])
    ex_pre, _ = max_excess(sim.trace, p.R, p.B, end=c)
    return dict(ex_new=ex_new, allow=allow, comp=(comp - c) / TPS, repl=repl,
                beyond=ex_new - allow, ex_pre=ex_pre, sim=sim)


# ---- adversarial ------------------------------------------------------------------------------
def adv_onoff(p, seed, n=4, T_s=150):
    """Envoys flip between idle (buckets fill up) and flood, often right after an assignment
    arrives, and join/leave; shares shift all the time so old/pending shares matter."""
    rng = random.Random(seed)
    T = T_s * TPS
    specs = []
    for i in range(n):
        segs = [(0, 0, False)]
        t = rng.randrange(3000)
        while t < T:
            segs.append((t, rng.choice([0, 0, 50, 400, 5000, 20000]), False))
            t += rng.choice([300, 1000, 2500, 5000, 7000])
        specs.append(segs)
    sim = Sim(p.copy(seed=seed), specs, T)
    # burst right after an assignment is received: on every receipt, flood for 200 ms
    for e in sim.envoys:
        if rng.random() < 0.5:
            base = e

            def hook(e, t, _rng=rng):
                if t - sim.last_rx.get(e.idx, -10 ** 9) < 200:
                    return 50
                _, r, _ = e.rate_at(t)
                e.acc += r
                k = int(e.acc // TPS)
                e.acc -= k * TPS
                return k
            base.burst_hook = hook
    sim.run()
    return max_excess(sim.trace, p.R, p.B)


def adv_reconnect(p, seed, n=3, T_s=150, server_sees=True):
    """Streams die without goodbye; the Envoy keeps enforcing its cached assignment until TTL and
    reconnects at its next timer tick as a NEW holder. Demands flip so the old share is big."""
    rng = random.Random(seed)
    T = T_s * TPS
    specs = []
    for i in range(n):
        segs = [(0, 0, False)]
        t = rng.randrange(2000)
        while t < T:
            segs.append((t, rng.choice([0, 200, 3000, 20000]), False))
            t += rng.choice([700, 3000, 6000])
        specs.append(segs)
    evs = []
    sim = Sim(p.copy(seed=seed), specs, T)
    for k in range(40):
        t = rng.randrange(5000, T - 1000)
        i = rng.randrange(n)
        sim.at(t, lambda t, e=sim.envoys[i]: e.break_stream(t, server_sees))
    # Envoys that leave for good (process gone) and come back as new processes
    for k in range(6):
        t = rng.randrange(5000, T - 20000)
        i = rng.randrange(n)
        e = sim.envoys[i]

        def leave(t, e=e):
            e.break_stream(t, True)
            e.gone = True

        def come(t, e=e):
            e.gone = False
            e.created = False
            e.action, e.exp, e.tok = None, None, 0
        sim.at(t, leave)
        sim.at(t + rng.randrange(1000, 15000), come)
    sim.run()
    return max_excess(sim.trace, p.R, p.B)


def adv_shift(p, seed, T_s=120):
    """Targeted: two Envoys swap a large share back and forth every interval; each report is
    timed so the shrinking Envoy's report crosses its own assignment (delay model decides whether
    that is caught); a third floods continuously so any freed rate is used at once."""
    rng = random.Random(seed)
    T = T_s * TPS
    specs = [[(0, 0, False)] + [(t, 20000 if (t // 5000) % 2 == 0 else 10, False) for t in range(500, T, 5000)],
             [(0, 0, False)] + [(t, 10 if (t // 5000) % 2 == 0 else 20000, False) for t in range(500, T, 5000)],
             [(0, 0, False), (rng.randrange(500), 20000, False)]]
    sim = Sim(p.copy(seed=seed), specs, T)
    for e in sim.envoys:
        e.phase = rng.randrange(REPORT_S * TPS)
    sim.run()
    return max_excess(sim.trace, p.R, p.B)


# ---- output -----------------------------------------------------------------------------------
def fmt_ex(x):
    return ("VIOLATION +%.1f" % x) if x > 1e-9 else "ok (%.0f)" % x


def part_scenarios(p):
    rows = []
    t0 = time.time()
    for B in (1000, 100):
        r = s1_equal(p, B=B)
        rows.append(("1 equal x3 saturating, R=1000 B=%d" % B,
                     "under-admission %.2f%%; all within 10%% of fair after %d s (%.1f intervals); "
                     "max window excess %s" % (100 * r["under"], r["settle"], r["settle"] / 5, fmt_ex(r["excess"]))))
    for B in (1000, 100):
        r = s1_equal(p, B=B, poisson_total=950)
        rows.append(("1b Poisson 3x317/s (0.95 R), B=%d" % B,
                     "under-admission %.2f%% vs exact; max excess %s" % (100 * r["under"], fmt_ex(r["excess"]))))
    for name, q in (("mult (as specified)", p.copy(hr_mode="mult")),
                    ("spare", p.copy(hr_mode="spare")),
                    ("spare + 5 s gap snap", p.copy(hr_mode="spare", snap=True)),
                    ("spare, margin 1.02, snap", p.copy(hr_mode="spare", snap=True, margin=1.02))):
        r = s2_unequal(q)
        rows.append(("2 unequal 100/300/2000, %s" % name,
                     "admitted %s/s (fair 100/300/600); under-admission %.2f%%; within 10%% after %s s; excess %s"
                     % ("/".join("%.0f" % x for x in r["rates"]), 100 * r["under"],
                        r["settle"] if r["settle"] < WARM + MEAS else "never", fmt_ex(r["excess"]))))
    for name, q in (("mult", p.copy(hr_mode="mult")),
                    ("spare, margin 1.02, snap", p.copy(hr_mode="spare", snap=True, margin=1.02))):
        r = s2_poisson(q)
        rows.append(("2b unequal Poisson 100/300/2000, %s" % name,
                     "admitted %s/s; under-admission %.2f%%; excess %s"
                     % ("/".join("%.0f" % x for x in r["rates"]), 100 * r["under"], fmt_ex(r["excess"]))))
    r = s3_idle_newcomer(p)
    iv = lambda x: "n/a" if x is None else "%s s (%.1f intervals)" % (x, x / REPORT_S)
    rows.append(("3 idle gives back (3 sat., E0 idles at 30 s)",
                 "server stops counting E0 after %s; others admit >= 90%% of R_cap after %s"
                 % (iv(r["release"]), iv(r["give"]))))
    rows.append(("3 idle holder returns (E0 at 60 s)", "first admit after %s; >= 90%% of fair after %s"
                 % (iv(r["back_first"]), iv(r["back"]))))
    rows.append(("3 newcomer joins 3 saturating (95 s)", "first admit after %s; >= 90%% of fair after %s; excess %s"
                 % (iv(r["new_first"]), iv(r["new"]), fmt_ex(r["excess"]))))
    r = s4_lowered(p)
    rows.append(("4 rule 1000/s -> 200/s at 40 s",
                 "max excess over B+R_new*w %.0f; old assignments' allowance %.0f; beyond it %s; "
                 "complies for windows starting >= %.1f s after; old replaced after %s s; pre-change %s"
                 % (r["ex_new"], r["allow"], fmt_ex(r["beyond"]), r["comp"],
                    "/".join("%.1f" % x for x in r["repl"]), fmt_ex(r["ex_pre"]))))
    return rows, time.time() - t0


def part_sweep(p):
    """One factor at a time around p (the full grid is 108 points x 4 scenarios; the factors
    act on different scenarios, so one-at-a-time shows each trade-off)."""
    grid = [("reserve", [0.0, 0.005, 0.01, 0.02]), ("headroom", [1.1, 1.25, 1.5]),
            ("burst_frac", [0.25, 0.5, 0.9]), ("ttl", [10, 12, 15])]
    out = []
    worst = -INF
    for name, vals in grid:
        for v in vals:
            q = p.copy(**{name: v})
            a = s1_equal(q, B=1000)
            b = s1_equal(q, B=100, poisson_total=950)
            c = s1_equal(q, B=1000, poisson_total=950)
            d = s2_unequal(q)
            e = s3_idle_newcomer(q)
            f = adv_reconnect(q, 7)
            g = adv_onoff(q, 3)
            worst = max(worst, a["excess"], b["excess"], c["excess"], d["excess"], e["excess"], f[0], g[0])
            out.append((name, v, a["under"], c["under"], b["under"], d["under"], e["new"], e["back"],
                        f[0], g[0]))
    return out, worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="scenarios",
                    choices=["scenarios", "sweep", "adversarial", "selftest"])
    ap.add_argument("--reserve", type=float, default=0.01)
    ap.add_argument("--headroom", type=float, default=1.25)
    ap.add_argument("--hr-mode", default="mult", choices=["mult", "spare"])
    ap.add_argument("--burst-frac", type=float, default=0.5)
    ap.add_argument("--ttl", type=int, default=12)
    ap.add_argument("--max-rtt", type=float, default=0.5)
    ap.add_argument("--snap", action="store_true", help="snap report gaps to the 5 s timer")
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    p = P(reserve=a.reserve, headroom=a.headroom, hr_mode=a.hr_mode, burst_frac=a.burst_frac,
          ttl=a.ttl, max_rtt=a.max_rtt, snap=a.snap)
    t0 = time.time()
    print("# command: python3 bench/rlqs_policy.py " + " ".join(sys.argv[1:]))
    print("# params: R=%d B=%d reserve=%g headroom=%g hr_mode=%s burst_frac=%g ttl=%ds F=%ds "
          "max_rtt=%gs delay=%s snap=%s dt=1ms" % (p.R, p.B, p.reserve, p.headroom, p.hr_mode,
                                                   p.burst_frac, p.ttl, p.F, p.max_rtt, p.delay, p.snap))
    if a.part == "selftest":
        rng = random.Random(5)
        for k in range(30):
            tr = [rng.choice([0, 0, 0, 1, 2, 5, 40]) for _ in range(400)]
            R, B = rng.choice([(1000, 10), (200, 50), (5000, 3)])
            x, _ = max_excess(tr, R, B)
            y = max_excess_brute(tr, R, B)
            assert abs(x - y) < 1e-6, (x, y)
        # the exact reference itself must pass with equality at saturation
        sim = Sim(p, [sat()] * 3, 20 * TPS).run()
        x, _ = max_excess(sim.ref, p.R, p.B)
        y = max_excess_brute(sim.ref[:3000], p.R, p.B)
        print("selftest: checker == brute force on 30 random traces; exact GCRA reference max "
              "excess %.3f (brute, first 3 s: %.3f)" % (x, y))
    elif a.part == "scenarios":
        rows, dt = part_scenarios(p)
        w = max(len(r[0]) for r in rows)
        print("| %-*s | %s |" % (w, "scenario", "figures"))
        print("|%s|%s|" % ("-" * (w + 2), "-" * 10))
        for r in rows:
            print("| %-*s | %s |" % (w, r[0], r[1]))
    elif a.part == "sweep":
        out, worst = part_sweep(p)
        print("| factor | value | under sat B=1000 | under Poisson .95R B=1000 | under Poisson .95R B=100 "
              "| under unequal | newcomer s | returning s | reconnect excess | on/off excess |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for o in out:
            print("| %s | %g | %.2f%% | %.2f%% | %.2f%% | %.2f%% | %s | %s | %s | %s |"
                  % (o[0], o[1], 100 * o[2], 100 * o[3], 100 * o[4], 100 * o[5], o[6], o[7],
                     fmt_ex(o[8]), fmt_ex(o[9])))
        print("worst window excess over every sweep run: %s" % fmt_ex(worst))
    elif a.part == "adversarial":
        rows = []
        tight = p.copy(reserve=0.0, burst_frac=0.9)
        variants = [("policy as specified", p),
                    ("tight: reserve 0, burst_frac 0.9", tight),
                    ("tight + spare headroom + snap", tight.copy(hr_mode="spare", snap=True, margin=1.0)),
                    ("tight + one-way delays each <= max_rtt (down = max_rtt)", tight.copy(delay="oneway")),
                    ("tight + 5% of assignments delivered 2-7 s late (> max_rtt)", tight.copy(delay="stall")),
                    ("tight + naive: drop holder on stream close", tight.copy(on_close="drop")),
                    ("tight + naive: lazy accrual", tight.copy(accrual="lazy"))]
        for name, q in variants:
            res = {}
            for kind, fn in (("on/off+burst-after-assign", lambda s: adv_onoff(q, s)),
                             ("reconnect/leave", lambda s: adv_reconnect(q, s)),
                             ("share swap", lambda s: adv_shift(q, s))):
                best = (-INF, None, None)
                for s in range(a.seeds):
                    x, w = fn(s)
                    if x > best[0]:
                        best = (x, s, w)
                res[kind] = best
            rows.append((name, res))
        print("| variant | worst max window excess over B + R*w, per adversary (over %d seeds) |" % a.seeds)
        print("|---|---|")
        for name, res in rows:
            print("| %s | %s |" % (name, "; ".join(
                "%s: %s (seed %s, window %.3f-%.3f s)" % (k, fmt_ex(v[0]), v[1], v[2][0] / TPS, v[2][1] / TPS)
                for k, v in res.items())))
    print("# %.1f s" % (time.time() - t0))


if __name__ == "__main__":
    main()
