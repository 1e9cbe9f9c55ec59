"""The clock sampler (microbench/kit/clocks.py) on a fake NVML: what it records while a figure
is timed, and how it says a run was slowed."""
import time

from microbench.kit import clocks as C


class FakeNv:
    def __init__(self, mhz, reasons=0, max_mhz=1980, fail=()):
        self.mhz, self.reasons, self.max_mhz, self.fail = list(mhz), reasons, max_mhz, fail

    def _f(self, name):
        if name in self.fail:
            raise RuntimeError(name)

    def nvmlDeviceGetHandleByIndex(self, i):
        self._f("handle")
        return ("gpu", i)

    def nvmlDeviceGetMaxClockInfo(self, h, t):
        self._f("max")
        return self.max_mhz

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetClockInfo(self, h, t):
        self._f("clock")
        return self.mhz.pop(0) if len(self.mhz) > 1 else self.mhz[0]

    def nvmlDeviceGetPowerUsage(self, h):
        return 690_500

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.reasons


def test_samples_a_power_capped_window():
    s = C.ClockSampler(0, period_s=0.001, nv=FakeNv([1980, 1600, 1500, 1550], reasons=0x4 | 0x1))
    with s:
        time.sleep(0.02)
    c = s.summary()
    assert c.samples >= 3 and c.sm_mhz_min == 1500 and c.sm_mhz_max_spec == 1980
    assert c.reasons == ("sw_power_cap",)             # idle (0x1) is not a slowdown
    assert c.power_w_max == 690.5 and c.power_limit_w == 700
    assert c.slowed()
    assert "limited by sw_power_cap" in c.describe() and "of 700" in c.describe()
    rec = c.as_record()
    assert rec["clock_limits"] == "sw_power_cap" and rec["sm_clock_min_mhz"] == 1500


def test_full_clock_is_not_slowed():
    s = C.ClockSampler(0, nv=FakeNv([1980]))
    s.start()
    c = s.stop()
    assert c.sm_mhz_median == 1980 and c.reasons == () and not c.slowed()
    assert C.ClockSampler(0, nv=FakeNv([1700])).start().stop().slowed()   # < 90% of 1980


def test_without_nvml_it_says_why_and_records_nothing():
    s = C.ClockSampler(0, nv=FakeNv([1980], fail=("handle",)))
    c = s.start().stop()
    assert c.sm_mhz_median is None and c.samples == 0 and "NVML unavailable" in c.note
    assert not c.slowed() and "not sampled" in c.describe()
    assert C.ClockSampler(0, nv=FakeNv([1980], fail=("clock",))).start().stop().note


def test_nvml_index_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert C._visible_index(0) == 3 and C._visible_index(1) == 1 and C._visible_index(2) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    assert C._visible_index(0) == 0


def test_stage_cost_note_names_the_lowest_clock_and_reasons():
    from microbench.stage_cost.probe import clock_note

    capped = C.ClockSampler(0, nv=FakeNv([1500], reasons=0x4)).start().stop()
    low = C.ClockSampler(0, nv=FakeNv([1700])).start().stop()
    n = clock_note([capped, low], 24)
    assert "2 of 24 points" in n and "lowest 1500 MHz" in n and "sw_power_cap" in n
    assert "(1980 MHz)" in n


def test_a_window_left_open_is_closed_by_the_next_start():
    s = C.ClockSampler(0, period_s=0.001, nv=FakeNv([1980]))
    s.start()
    first = s._thread
    s.start()
    assert not first.is_alive() and s._thread is not first
    s.stop()
