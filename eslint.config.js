// typescript-eslint's strict type-checked rules over every TypeScript file; Prettier owns layout,
// and max-len holds the comments and strings it does not wrap to a side-by-side diff.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['node_modules/', 'dist/', 'out/', 'bench/out/', 'public/', '.stryker-tmp/', 'test-results/'] },
  js.configs.recommended,
  ...tseslint.configs.strictTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      // numbers read naturally in messages; objects and undefined in a message are the bugs this catches
      '@typescript-eslint/restrict-template-expressions': ['error', { allowNumber: true }],
      '@typescript-eslint/no-confusing-void-expression': ['error', { ignoreArrowShorthand: true }],
      // a leading underscore says a parameter is there for its signature (an override's, a callback's)
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', ignoreRestSiblings: true }],
      'max-len': ['error', { code: 120, ignoreUrls: true }],
    },
  },
  {
    // plain JavaScript (this file, Stryker's) is outside tsconfig: no types to check it against
    files: ['**/*.{js,mjs}'],
    ...tseslint.configs.disableTypeChecked,
  },
  {
    // the package's commands start in Node before TypeScript can be loaded
    files: ['bin/**'],
    languageOptions: { globals: { process: 'readonly', console: 'readonly' } },
  },
  {
    // a test's name is its specification, one string
    files: ['test/**'],
    rules: { 'max-len': ['error', { code: 120, ignoreUrls: true, ignoreStrings: true, ignoreTemplateLiterals: true }] },
  },
);
