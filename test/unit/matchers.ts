// vitest types its asymmetric matchers `any`; as `unknown` they sit in a typed expected object like any other value.
import { expect } from 'vitest';

/** Matches any string that `pattern` matches. */
export const stringMatching = (pattern: RegExp | string): unknown => expect.stringMatching(pattern);

/** Matches any string. */
export const anyString = (): unknown => expect.any(String);

/** Matches any number. */
export const anyNumber = (): unknown => expect.any(Number);
