/** The one DOM helper the views share: an element with properties and children. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: Partial<HTMLElementTagNameMap[K]> & { className?: string; dataset?: Record<string, string> } = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const { dataset, ...rest } = props;
  const el = Object.assign(document.createElement(tag), rest);
  if (dataset) Object.assign(el.dataset, dataset);
  el.append(...children);
  return el;
}

/** The page's element `id`, of the kind given (HTMLElement unless told): a page without it is a broken build. */
export function $(id: string): HTMLElement;
export function $<T extends HTMLElement>(id: string, kind: { new (): T; prototype: T }): T;
export function $(id: string, kind: { new (): HTMLElement; prototype: HTMLElement } = HTMLElement): HTMLElement {
  const el = document.getElementById(id);
  if (!(el instanceof kind)) throw new Error(`the page has no ${kind.name} #${id}`);
  return el;
}

export const seconds = (ms: number): string =>
  ms < 10_000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms / 1000)} s`;
