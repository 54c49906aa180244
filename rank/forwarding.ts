// Wrappers that pass every method call of an interface on to a target through one function (a
// queue, a turn that waits out a restart). The methods come from one table of the interface's
// method names that the compiler holds to the interface, so a method added to the interface is
// forwarded by every wrapper, never missed by one of them.

/** Each method of Api named once, optional ones included, and nothing else. */
export type MethodNames<Api> = { [M in keyof Api]-?: true };

/** Runs one call on the target, when and where the wrapper decides. */
export type Through<Api> = <T>(call: (target: Api) => Promise<T>) => Promise<T>;

type AnyMethod = (...args: unknown[]) => Promise<unknown>;

function forwarder<Api>(method: string, through: Through<Api>): AnyMethod {
  return (...args) => through((target) => (target[method as keyof Api] as AnyMethod)(...args));
}

/** An Api whose every method named in `names` runs the target's through `through`. */
export function forward<Api extends object>(names: MethodNames<Api>, through: Through<Api>): Api {
  return Object.fromEntries(Object.keys(names).map((method) => [method, forwarder(method, through)])) as Api;
}

/** What a Forwarding class's subclass says: how a call reaches its target. Named, so declarations can name it. */
// eslint-disable-next-line @typescript-eslint/no-unnecessary-type-parameters -- each Forwarding class's own Api
export abstract class ForwardingBase<Api> {
  protected abstract through<T>(call: (target: Api) => Promise<T>): Promise<T>;
}

/**
 * A base class whose instances are Apis, each method running the target's through the subclass's
 * `through`; a subclass's own method of the same name takes its place (it is on the prototype chain first).
 */
export function Forwarding<Api extends object>(names: MethodNames<Api>): abstract new () => ForwardingBase<Api> & Api {
  abstract class Base extends ForwardingBase<Api> {}
  for (const method of Object.keys(names)) {
    Object.defineProperty(Base.prototype, method, {
      value(this: Base, ...args: unknown[]) {
        return forwarder<Api>(method, (call) => this.through(call))(...args);
      },
      writable: true,
      configurable: true,
    });
  }
  return Base as unknown as abstract new () => Base & Api;
}
