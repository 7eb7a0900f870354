package assembly // import "github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/assembly"

import "container/list"

// ordered is a map that remembers insertion order, with O(1) move-to-back and pop-front: the
// Python guard's OrderedDict.
type ordered[K comparable, V any] struct {
	items map[K]*list.Element
	order *list.List
}

type entry[K comparable, V any] struct {
	key   K
	value V
}

func newOrdered[K comparable, V any]() *ordered[K, V] {
	return &ordered[K, V]{items: map[K]*list.Element{}, order: list.New()}
}

func (o *ordered[K, V]) Len() int { return len(o.items) }

func (o *ordered[K, V]) Get(k K) (V, bool) {
	if e, ok := o.items[k]; ok {
		return e.Value.(*entry[K, V]).value, true
	}
	var zero V
	return zero, false
}

// Set stores v under k; a new key goes to the back, an existing one keeps its place.
func (o *ordered[K, V]) Set(k K, v V) {
	if e, ok := o.items[k]; ok {
		e.Value.(*entry[K, V]).value = v
		return
	}
	o.items[k] = o.order.PushBack(&entry[K, V]{k, v})
}

func (o *ordered[K, V]) MoveToBack(k K) {
	if e, ok := o.items[k]; ok {
		o.order.MoveToBack(e)
	}
}

func (o *ordered[K, V]) Delete(k K) (V, bool) {
	if e, ok := o.items[k]; ok {
		delete(o.items, k)
		o.order.Remove(e)
		return e.Value.(*entry[K, V]).value, true
	}
	var zero V
	return zero, false
}

// Front is the oldest entry.
func (o *ordered[K, V]) Front() (K, V, bool) {
	if e := o.order.Front(); e != nil {
		en := e.Value.(*entry[K, V])
		return en.key, en.value, true
	}
	var k K
	var v V
	return k, v, false
}

func (o *ordered[K, V]) Clear() {
	o.items = map[K]*list.Element{}
	o.order.Init()
}
