// Progress of long work measured in bytes, on stderr: one line updated in place on a terminal, a
// line per tenth in a log (where carriage returns would make one endless line).

/** A reporter of `done` of `total` bytes under `label`, writing only when what it shows changes. */
export function byteProgress(label: string): (done: number, total: number) => void {
  let shown = -1;
  return (done, total) => {
    const tty = process.stderr.isTTY;
    const step = Math.floor(((tty ? 100 : 10) * done) / total);
    if (step === shown) return;
    shown = step;
    const line = `${label}: ${(done / 1e9).toFixed(2)} of ${(total / 1e9).toFixed(2)} GB`;
    process.stderr.write(tty ? `\r${line}${done === total ? '\n' : ''}` : `${line}\n`);
  };
}
