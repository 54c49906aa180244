import { describe, expect, it } from 'vitest';
import { Accusations, DISTINCT_ACCUSERS_TO_CONVICT } from '../../coordinator/accusations.ts';

// The one rule for one worker's word against another's (coordinator/accusations.ts): over repeated
// jobs the liar, not the honest worker it names, ends up banned.
describe('the record of accusations', () => {
  it(`convicts on ${DISTINCT_ACCUSERS_TO_CONVICT} distinct peers' words, never on one's`, () => {
    expect(DISTINCT_ACCUSERS_TO_CONVICT).toBe(2);
    const record = new Accusations();
    expect(record.accuse('honest-1', 'liar')).toEqual({ convicted: null, setAside: ['liar'], cleared: [], why: '' });
    expect(record.isSetAside('liar')).toBe(true);
    expect(record.isSetAside('honest-1')).toBe(false);
    // the same accuser again (its tabs, its rejoins) adds nothing
    expect(record.accuse('honest-1', 'liar').convicted).toBeNull();
    record.newJob();
    expect(record.isSetAside('liar')).toBe(false);
    expect(record.accuse('honest-2', 'liar')).toMatchObject({ convicted: 'liar', why: '2 distinct peers accused it' });
  });

  it('a liar blaming its peers in turn is convicted at its second distinct victim, which stays; the first is cleared', () => {
    const record = new Accusations();
    expect(record.accuse('liar', 'honest-1').setAside).toEqual(['honest-1']);
    const judged = record.accuse('liar', 'honest-2');
    expect(judged.convicted).toBe('liar');
    expect(judged.why).toMatch(/accused 2 distinct peers, and no other peer's word backed any/);
    expect(judged.setAside).toEqual([]);
    expect(judged.cleared.sort()).toEqual(['honest-1', 'honest-2']);
    expect(record.isSetAside('honest-1')).toBe(false);
    // its record is gone with it: the honest workers carry no accusation of its
    expect(record.accuse('honest-1', 'honest-2').convicted).toBeNull();
  });

  it('an honest worker accused by one liar, job after job, is only ever set aside', () => {
    const record = new Accusations();
    for (let job = 0; job < 5; job++) {
      record.newJob();
      expect(record.accuse('liar', 'honest')).toEqual({
        convicted: null,
        setAside: ['honest'],
        cleared: [],
        why: '',
      });
    }
  });

  it('an accusation that held (its accused convicted) does not count against its accuser later', () => {
    const record = new Accusations();
    record.accuse('honest-1', 'liar-a');
    expect(record.accuse('honest-2', 'liar-a').convicted).toBe('liar-a');
    // honest-1 has named two distinct peers, but the first was a liar
    expect(record.accuse('honest-1', 'liar-b')).toMatchObject({ convicted: null, setAside: ['liar-b'] });
  });

  it('a spot check between two with no third sets both aside, bans neither, and the liar falls at its second dispute', () => {
    const record = new Accusations();
    expect(record.dispute('liar', 'honest-1')).toEqual({
      convicted: null,
      setAside: ['liar', 'honest-1'],
      cleared: [],
      why: '',
    });
    record.newJob();
    const second = record.dispute('liar', 'honest-2');
    expect(second.convicted).toBe('liar');
    expect(second.cleared.sort()).toEqual(['honest-1', 'honest-2']);
    expect(record.isSetAside('honest-2')).toBe(false);
  });

  it('a conviction on the coordinator’s own evidence voids the convicted’s accusations', () => {
    const record = new Accusations();
    record.accuse('liar', 'honest');
    expect(record.isSetAside('honest')).toBe(true);
    expect(record.convict('liar')).toEqual(['honest']);
    expect(record.isSetAside('honest')).toBe(false);
  });

  it('a trusted worker’s word is the coordinator’s own: the untrusted one of the two is convicted at once', () => {
    const record = new Accusations();
    const trusted = new Set(['this-machine']);
    expect(record.accuse('liar', 'this-machine', trusted)).toMatchObject({ convicted: 'liar', setAside: [] });
    expect(record.dispute('this-machine', 'liar-2', trusted)).toMatchObject({ convicted: 'liar-2' });
    expect(record.accuse('this-machine', 'other', new Set(['this-machine', 'other']))).toMatchObject({
      convicted: null,
      setAside: ['other'],
    });
  });

  it('a worker cannot accuse itself', () => {
    expect(new Accusations().accuse('a', 'a')).toEqual({ convicted: null, setAside: [], cleared: [], why: '' });
  });
});
