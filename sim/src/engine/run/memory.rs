//! Each device's memory over the run: the tasks' memory events, the peak and what was live at it.

use super::Engine;
use crate::lower::NONE;
use crate::report::timeline::MemorySample;

impl Engine<'_> {
    /// The memory events of task `t` at its start or end (most tasks have none).
    #[inline]
    pub(super) fn memory(&mut self, t: u32, at_end: bool, now: u64) {
        let m = self.p.tasks[t as usize].memory;
        if m != NONE {
            self.memory_events(t, m, at_end, now);
        }
    }

    fn memory_events(&mut self, t: u32, mut m: u32, at_end: bool, now: u64) {
        let mb = self.p.tasks[t as usize].micro_batch;
        while m != NONE {
            let ev = self.p.memory_events[m as usize];
            m = ev.next;
            if ev.at_end == at_end {
                let d = ev.device as usize;
                if !self.is_new_peak(d, ev.activation_bytes, ev.buffer_bytes) {
                    self.settle_peak(d);
                }
                let key = (ev.tag, mb);
                let v = self.live[d].entry(key).or_insert(0.0);
                *v += ev.activation_bytes;
                if v.abs() < 1.0 {
                    self.live[d].remove(&key);
                }
                let live = self.live[d].len();
                if let Some(keys) = &mut self.dirty[d] {
                    keys.push(key);
                    if keys.len() > 2 * live + 64 {
                        self.dirty[d] = None;
                    }
                }
                self.apply_memory(d, ev.activation_bytes, ev.buffer_bytes, now);
            }
        }
    }

    /// Whether adding these bytes to device `d` sets a new peak (the test `apply_memory` makes).
    fn is_new_peak(&self, d: usize, activation_bytes: f64, buffer_bytes: f64) -> bool {
        let total = (self.cur_act[d] + activation_bytes) + (self.cur_buf[d] + buffer_bytes);
        total > self.res.peak_activations[d] + self.res.peak_buffers[d]
    }

    /// Copies device `d`'s live activations at its peak, if the peak is still the current state.
    pub(super) fn settle_peak(&mut self, d: usize) {
        if std::mem::take(&mut self.peak_pending[d]) {
            match self.dirty[d].replace(Vec::new()) {
                Some(keys) => {
                    for key in keys {
                        match self.live[d].get(&key) {
                            Some(&b) => self.peak_snap[d].insert(key, b),
                            None => self.peak_snap[d].remove(&key),
                        };
                    }
                }
                None => self.peak_snap[d].clone_from(&self.live[d]),
            }
        }
    }

    fn apply_memory(&mut self, d: usize, activation_bytes: f64, buffer_bytes: f64, now: u64) {
        let new_peak = self.is_new_peak(d, activation_bytes, buffer_bytes);
        self.cur_act[d] += activation_bytes;
        self.cur_buf[d] += buffer_bytes;
        if new_peak {
            self.res.peak_activations[d] = self.cur_act[d];
            self.res.peak_buffers[d] = self.cur_buf[d];
            self.res.peak_time_ns[d] = now;
            self.peak_pending[d] = true;
        }
        if self.opts.record {
            self.res.timeline.memory.push(MemorySample {
                device: self.p.devices[d],
                time_ns: now,
                activations: self.cur_act[d],
                moved_weights: self.cur_buf[d],
            });
        }
    }
}
